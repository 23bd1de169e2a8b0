"""The outer loop: protocol and wire math, the synchronizer state machine and its durable state, policies, merging, outer optimizers, fragments, codecs, integrity, the learner's side."""
