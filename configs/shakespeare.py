r"""Language modelling on Shakespeare's plays (byte-level), the project's default job.

The README's main job compares data-parallel, synchronous DiLoCo and Decoupled DiLoCo:

  python -m experiments.train --config=configs/shakespeare.py:mode=compare --workdir=runs/default

Variants after the colon, comma-separated (e.g. `configs/shakespeare.py:model=tiny,runlocal`):
  mode=dp          one island, data-parallel SPMD over every local device (the default mode).
  mode=diloco      M learners, all synced every H steps, mean, Nesterov outer step.
  mode=streaming   Streaming DiLoCo: P fragments at staggered offsets, overlap tau, fp4.
  mode=decoupled   Decoupled DiLoCo: quorum K, adaptive grace, token weights, RDA; never waits.
  mode=compare     dp, diloco and decoupled on one token budget, the last learner 3x slower;
                   prints a table and draws compare.png (diloco/config/presets.py).
  model=tiny|small|base   tiny ~29k params (tests), small ~0.89M (default), base ~27M;
  model=35m|90m|180m      the DiLoCo scaling-laws shapes (19M, 64M, 151M params with bytes).
                   model.dtype (bfloat16: compute; weights and optimizer stay float32),
                   model.attention (einsum | dot_product_attention | cudnn) and model.remat
                   (none | block | dots) choose the step's numerics, kernel and memory.
  runlocal         shrink everything to a few seconds on a laptop (tiny model, 40 steps).
  steps=N          inner steps per learner; batch=N batch per learner (sequences); seq=N bytes.
  learners=N       M, the number of learners (islands).
  chaos=none|light|heavy|<fault lines>|<file>   a fault schedule (diloco/chaos/schedule.py); turns on
                   learner checkpoints every H steps, synchronizer checkpoints every P merges and
                   max_staleness = 4M. light/heavy are seeded Poisson schedules drawn over 4x the
                   nominal run (steps x sim.step_s), shaped by the chaos section below.

Any key can also be overridden on the command line, e.g. `--config.optimizer.lr=1e-3`; unknown keys
fail (the config is locked). Every key is documented where it is set below.

Expected on 2 CPU cores (BENCHMARKS.md has measured figures): mode=dp, small model, 300 steps of
32x128 bytes reaches about 2.7 bits per byte in 2-3 minutes; mode=compare finishes in about 3-4.
"""

import ml_collections

from diloco import train
from diloco.config import deploy as deploy_lib, variants
from diloco.data import default_data_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = variants.parse_arg(
      arg,
      mode="dp",
      model="small",
      runlocal=False,
      steps=0,
      batch=0,
      seq=0,
      learners=0,
      chaos="none",
  )
  c = ml_collections.ConfigDict()
  c.mode = arg.mode
  c.seed = 0
  c.model = variants.model_config(arg.model)
  c.data = default_data_config()

  c.seq_len = 128
  c.batch_size = 32  # global, in sequences
  c.steps = 300
  c.stop_after_steps = 0  # >0: stop this invocation after N steps, as a preemption would
  c.init_from = ""  # a run's workdir: start from its newest params (fresh optimizer, step, data)

  c.optimizer = ml_collections.ConfigDict(
      dict(
          name="adamw",
          lr=1e-2,
          warmup_steps=20,
          decay_steps=280,
          min_lr_ratio=0.1,
          b1=0.9,
          b2=0.95,
          weight_decay=0.1,
          clip_norm=1.0,
      )
  )

  # -1: the remaining devices; expert > 1 splits a mixture of experts' weights over an 'expert'
  # axis of that size (expert parallelism; stacked learners keep experts whole)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1))
  c.distributed = False  # call jax.distributed.initialize() (multi-host jobs)

  c.log_every = 10
  c.eval_every = 200
  c.checkpoint_every = 200
  c.progress_bar = True  # on a terminal: a bar per run (tokens, simulated time, merges, learners)
  c.timeline = True  # multi-learner virtual runs draw WORKDIR/timeline.png

  c.outer = ml_collections.ConfigDict(
      dict(
          learners=4,  # M islands; the local devices are split evenly between them
          inner_steps=50,  # H: each fragment syncs once every H inner steps
          fragments=1,  # P: fragments of the parameters, synced at staggered offsets p*H/P
          fragment_kind="strided",  # strided: block i -> fragment i mod P; balanced: bin-packing
          overlap=0,  # tau: a fragment sent at step t is applied after step t+tau
          alpha=0.0,  # theta_p <- alpha*theta_local + (1-alpha)*theta_global on arrival
          codec="fp32",  # outer gradients on the wire: fp32 | bf16 | int8 | fp4 | 2bit | 1bit
          # fp4 uplink: linear (nearest) | log (nearest in log2) | stochastic (unbiased); linear won
          # the precision ablation (notebooks/decoupled_ablations.py)
          fp4_rounding="linear",
          error_feedback=False,  # learners add what the codec dropped to their next upload
          downlink_codec="",  # merged updates sent back; '' = same as codec
          optimizer="nesterov",  # outer optimizer: nesterov | sgd | delayed_nesterov
          lr=0.4,
          momentum=0.9,  # outer Nesterov; 0.4 beat 0.7 and 1.0 here (BENCHMARKS.md)
          delayed_period=4,
          delayed_c=0.0,  # delayed_nesterov: momentum every N merges, and c
          quorum=0,  # K: merge once K learners uploaded; 0 = all live learners (synchronous)
          grace_gamma=0.0,  # >0: adaptive grace window gamma*(tau*step - quorum - sync) after quorum
          weighting="equal",  # equal | tokens (w = tokens * tokens / steps)
          merge="mean",  # mean | rda (radial-directional averaging; embeddings always by mean)
          ema_decay=0.9,  # of the step, quorum and sync times behind the grace window
          max_staleness=1 << 20,  # contributions more versions behind are dropped
          staleness_damping=False,  # scale merges by the mean 1/(1+staleness) of their uploads
          broadcast="all",  # a merge goes to all live learners | contributors (async Local-SGD)
          dylu=False,  # DyLU: learner m syncs every floor(v_m/v_max * H) steps, speeds measured
          blocking=True,  # learners wait for a fragment tau steps after sending it (synchronous)
          elastic=False,  # quorum=0 only: crashed learners leave the quorum (else merges wait for them)
          outlier_factor=100.0,  # reject outer gradients with norm > factor x recent median; 0 = off
          outlier_history=4,
          outlier_window=16,  # norms before the fragment's median is used; kept
          clip_factor=0.0,  # >0: scale outer gradients above clip_factor x that median down to it
          learner_checkpoint_every=0,  # learner checkpoints every N inner steps (0 = none)
          sync_checkpoint_every=0,  # synchronizer checkpoints every N merges (0 = none)
          stack_learners=True,  # virtual runtime: learners' states stacked, stepped together
          stack_step="auto",  # stacked: vmap | map (one after the other) | auto (map on CPU)
      )
  )
  c.sim = ml_collections.ConfigDict(
      dict(
          step_s=1.0,  # simulated seconds per inner step of a speed-1 learner at batch_size
          step_jitter=0.0,  # sigma of a log-normal factor on every step time
          speeds="",  # per learner slowdown, e.g. '1,1,1,3'; '' = all 1
          batch_sizes="",  # per learner batch, e.g. '32,32,16,16'; '' = all batch_size
          start_times="",  # per learner start (simulated s); '' = all 0
          latency_s=0.1,  # one-way latency of each learner-synchronizer link
          bandwidth_gbps=1.0,  # bandwidth of each link
      )
  )
  c.chaos = ml_collections.ConfigDict(
      dict(
          schedule=arg.chaos,  # none | light | heavy | fault lines ('a; b') | a schedule file
          seed=0,  # of generated schedules and of bit flips
          mtbf_s=0.0,  # light/heavy: mean time from one fault's end to a learner's next; 0 = preset
          recovery_s=0.0,  # light/heavy: mean fault duration (crash recovery); 0 = preset
          recovery_dist="exp",  # exp | fixed | uniform (0.5-1.5 x the mean)
          sync_mtbf_s=-1.0,  # light/heavy: synchronizer crashes; -1 = preset, 0 = none
          kinds="",  # light/heavy: learner fault kinds, e.g. 'crash,straggle'; '' = preset
      )
  )
  c.compare = ml_collections.ConfigDict(
      dict(
          modes="dp,diloco,decoupled",  # mode=compare runs these on one token budget
          decoupled_fragments=24,
          decoupled_inner_steps=24,
      )
  )
  deploy_lib.add_deploy_section(c)  # threads/gRPC runtimes: bind, port, TLS, limits, TPU
  train.apply_mode(c, arg.mode, arg.runlocal, arg.learners)

  if arg.runlocal:
    c.model = variants.model_config("tiny" if arg.model == "small" else arg.model)
    c.seq_len, c.batch_size, c.steps = 32, 8, 40
    c.optimizer.warmup_steps, c.optimizer.decay_steps = 5, 35
    c.log_every, c.eval_every, c.checkpoint_every = 5, 20, 20
    c.data.eval_batches = 4
  if arg.steps:
    c.steps = arg.steps
    c.optimizer.decay_steps = max(arg.steps - c.optimizer.warmup_steps, 1)
  c.batch_size = arg.batch or c.batch_size
  c.seq_len = arg.seq or c.seq_len
  if arg.chaos != "none":  # checkpoints on both sides, and a staleness bound for late learners
    c.outer.learner_checkpoint_every = c.outer.inner_steps
    c.outer.sync_checkpoint_every = c.outer.fragments
    c.outer.max_staleness = 4 * c.outer.learners

  c.lock()
  return c
