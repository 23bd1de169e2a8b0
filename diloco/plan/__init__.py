"""Plans of a learner on a Cloud TPU slice, compiled on a CPU machine with libtpu: memory per chip,
FLOPs, roofline step time, and the bandwidth and goodput of M such learners."""
