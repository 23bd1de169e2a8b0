"""Every key of a run with its default, meaning and domain (unlocked, unresolved): the config
files (`configs/`) start from `base_config()` and only set values."""

import ml_collections

from diloco.config import deploy as deploy_lib, domains, keys, presets, resolve, sections
from diloco.config import variants

Auto = keys.Auto


def base_config() -> ml_collections.ConfigDict:
  """Every key with its default (unlocked, unresolved): configs built on this one start here."""
  c = keys.section(
      "",
      mode=("dp", "dp | diloco | streaming | decoupled | compare (diloco/config/presets.py)"),
      runlocal=(False, "shrink everything to a few seconds on a laptop (tiny model, 40 steps)"),
      recipe=(
          "none",
          "none | charles2025: a paper's inner optimizer and model, filled like a mode's preset"
          " (the keys' recipes=)",
          domains.among_of("diloco.config.presets", "RECIPES"),
      ),
      seed=(0, "of the parameters, the data order and the simulated step times"),
      seq_len=(Auto(128, runlocal=32, compare=64), "tokens (bytes) per sequence", domains.count()),
      batch_size=(
          Auto(32, runlocal=8, compare=16),
          "sequences per step, per learner (dp: global)",
          domains.count(),
      ),
      steps=(
          Auto(300, runlocal=40, compare=2000),
          "inner steps per learner (the token budget)",
          domains.count(),
      ),
      stop_after_steps=(
          0,
          ">0: stop this invocation after N steps, as a preemption would",
          domains.nonneg("0: run to the end"),
      ),
      init_from=("", "a run's workdir: start from its newest params (fresh optimizer, step, data)"),
      distributed=(False, "call jax.distributed.initialize() (multi-host jobs)"),
      log_every=(Auto(10, runlocal=5), "steps between training-metric rows", domains.count()),
      eval_every=(
          Auto(200, runlocal=20, compare=100),
          "steps between evaluations",
          domains.count(),
      ),
      checkpoint_every=(
          Auto(200, runlocal=20),
          "steps between checkpoints (mode=dp)",
          domains.count(),
      ),
      progress_bar=(
          True,
          "on a terminal: a bar per run (tokens, simulated time, merges, learners)",
      ),
      timeline=(True, "multi-learner virtual runs draw WORKDIR/timeline.png"),
      trackers=(
          "jsonl,tensorboard",
          "where metric rows go: jsonl (metrics.jsonl, always on: tools read it), tensorboard"
          " (WORKDIR/tb), wandb (pip install -e '.[wandb]'; offline without an API key)",
      ),
  )
  c.model = variants.model_section("small", runlocal_size="tiny", compare_size="tiny")
  c.data = sections.data()
  c.optimizer = keys.section(
      "optimizer",
      name=(
          "adamw",
          "inner optimizer: adamw | sgd",
          domains.among(("adamw", "sgd"), "expected adamw or sgd"),
      ),
      lr=(
          Auto(1e-2),
          "peak inner learning rate (mode=compare: compare.inner_lrs per mode)",
          domains.positive("must be a positive number (a negative rate ascends the loss)"),
      ),
      warmup_steps=(Auto(20, runlocal=5, compare=100), "linear warmup steps", domains.nonneg()),
      decay_steps=(
          Auto(280, derive=resolve.decay_steps),
          "cosine decay steps after warmup; preset: steps - warmup_steps",
          domains.nonneg("0 with warmup_steps=0: a constant rate"),
      ),
      min_lr_ratio=(
          Auto(0.1, recipes={"charles2025": 0.05}),
          "the cosine decays to this fraction of lr, reached at step warmup_steps + decay_steps"
          " (recipe=charles2025: 0.05)",
          domains.unit(),
      ),
      b1=(0.9, "AdamW beta1", domains.unit_open()),
      b2=(
          Auto(0.95, recipes={"charles2025": 0.99}),
          "AdamW beta2 (recipe=charles2025: 0.99)",
          domains.unit_open(),
      ),
      weight_decay=(
          0.1,
          "AdamW decoupled weight decay (multiplied by the learning rate); weight_decay_kind="
          "coupled only",
          domains.nonneg(),
      ),
      weight_decay_kind=(
          Auto("coupled", recipes={"charles2025": "independent"}),
          "coupled: weight_decay as optax's | independent: matrices shrink by lambda x lr_t/lr"
          " per step, lambda = 1/weight_decay_time_constant (recipe=charles2025)",
          domains.among(("coupled", "independent"), "expected coupled or independent"),
      ),
      weight_decay_time_constant=(
          Auto(0, derive=resolve.weight_decay_time_constant),
          "independent: T in steps, lambda = 1/T (preset: steps, the run's length); maps to"
          " optax weight_decay = 1/(T x lr)",
          domains.nonneg("steps; 0: coupled"),
      ),
      clip_norm=(
          1.0,
          "clip the gradient's global norm to this (0: no clipping)",
          domains.nonneg("0: no clipping"),
      ),
  )
  c.mesh = keys.section(
      "mesh",
      data=(-1, "devices on the island's data axis (-1: the remaining devices)", domains.axis()),
      fsdp=(
          Auto(1, derive=resolve.fsdp),
          "devices on the island's fsdp axis (parameters and optimizer state sharded); -1: the"
          " remaining devices (with data=-1: all of them); preset: -1 for model sizes from 35m",
          domains.axis(),
      ),
      expert=(
          1,
          ">1: a mixture of experts' weights split over an expert axis of this size",
          domains.count(),
      ),
      tensor=(
          1,
          ">1: tensor parallelism: attention heads, MLP width and vocabulary split over a"
          " 'tensor' axis of this size (models/logical.py)",
          domains.count(),
      ),
  )
  c.outer = keys.section("outer", **_outer())
  c.sim = keys.section(
      "sim",
      step_s=(
          1.0,
          "simulated seconds per inner step of a speed-1 learner at batch_size",
          domains.positive("must be > 0"),
      ),
      step_jitter=(0.0, "sigma of a log-normal factor on every step time", domains.nonneg()),
      time_limit_s=(
          0.0,
          ">0: no learner starts a step after this simulated time (equal time)",
          domains.nonneg("0: no limit"),
      ),
      speeds=(
          Auto("", derive=resolve.speeds),
          "per learner slowdown, e.g. '1,1,1,3'; '' = all 1 (compare: last 3x)",
      ),
      batch_sizes=("", "per learner batch, e.g. '32,32,16,16'; '' = all batch_size"),
      start_times=("", "per learner start (simulated s); '' = all 0"),
      stop_times=(
          "",
          "per learner time after which it starts no step and leaves (simulated s); 0 or '' = "
          "never (a learner that joins for a stretch: start_times and stop_times)",
      ),
      join_schedule=(
          "own",
          "a learner that starts late starts its lr schedule: own (at its first step) | clock"
          " (where one of its speed started at t = 0 would be: start time / its step time)",
          domains.among(("own", "clock"), "expected own or clock"),
      ),
      latency_s=(0.1, "one-way latency of each learner-synchronizer link", domains.nonneg()),
      bandwidth_gbps=(
          1.0,
          "bandwidth of each link",
          domains.where(lambda v, c: v > 0, "must be > 0 (inf: no transfer time)"),
      ),
  )
  c.chaos = keys.section(
      "chaos",
      schedule=(
          "none",
          "none | light | heavy | fault lines ('a; b') | a schedule file "
          "(diloco/chaos/schedule.py); on: checkpoints on both sides, max_staleness 4M",
      ),
      seed=(0, "of generated schedules and of bit flips"),
      mtbf_s=(0.0, "light/heavy: mean time from one fault's end to a learner's next; 0 = preset"),
      recovery_s=(0.0, "light/heavy: mean fault duration (crash recovery); 0 = preset"),
      recovery_dist=("exp", "exp | fixed | uniform (0.5-1.5 x the mean)"),
      sync_mtbf_s=(-1.0, "light/heavy: synchronizer crashes; -1 = preset, 0 = none"),
      kinds=("", "light/heavy: learner fault kinds, e.g. 'crash,straggle'; '' = preset"),
  )
  c.eval = keys.section(
      "eval",
      harness_tasks=(
          Auto("", compare="shakespeare_line_end"),
          "lm-evaluation-harness tasks scored at evaluations (pip install -e '.[eval]'): harness "
          "names, ours (shakespeare_line_end) or local task folders, comma-separated; '' = none",
      ),
      harness_every=(
          0,
          "score the harness tasks at every N-th evaluation as well as the final one",
          domains.nonneg("0: the final evaluation only"),
      ),
      harness_limit=(
          Auto(0, runlocal=100),
          "items per harness task (the first N)",
          domains.nonneg("0: every item"),
      ),
  )
  c.compare = keys.section(
      "compare",
      modes=("dp,diloco,decoupled", "mode=compare runs these on one token budget"),
      decoupled_fragments=(
          Auto(4, local={"compare": 4}),
          "P of the compared Decoupled DiLoCo run",
          domains.count(),
      ),
      decoupled_inner_steps=(
          Auto(20, local={"compare": 8}),
          "H of the compared Decoupled DiLoCo run",
          domains.count(),
      ),
      inner_lrs=(
          # the winners of configs/sweeps/main_job.py's grid (5e-3, 1e-2, 2e-2, 4e-2), 2026-12-02
          Auto("dp=0.02,diloco=0.01,decoupled=0.01"),
          "mode=lr,... each compared run's peak inner learning rate (tuned by "
          "configs/sweeps/main_job.py); a mode not named takes optimizer.lr",
      ),
  )
  deploy_lib.add_deploy_section(c)  # threads/gRPC runtimes: bind, port, TLS, limits, TPU
  return c


CODEC_WHY = "unknown codec; expected one of {names}"


def _outer() -> dict:
  """The `outer` section: the synchronizer, its policies and the learners' side."""
  return dict(
      learners=(
          Auto(4, compare=2, local=dict.fromkeys(presets.MULTI, 2)),
          "M islands; the local devices are split evenly between them",
          domains.count(),
      ),
      inner_steps=(
          Auto(50, decoupled=24, compare=20, local=dict(diloco=10, streaming=10, decoupled=8)),
          "H: each fragment syncs once every H inner steps",
          domains.count(),
      ),
      fragments=(
          Auto(1, diloco=1, streaming=4, decoupled=24, local=dict(streaming=2, decoupled=4)),
          "P: fragments of the parameters, synced at staggered offsets p*H/P",
          domains.count(),
      ),
      fragment_kind=(
          Auto("strided", decoupled="balanced"),
          "strided: block i -> fragment i mod P; balanced: " "bin-packing by bytes",
          domains.among_of("diloco.outer.fragments", "KINDS"),
      ),
      overlap=(
          Auto(0, diloco=0, streaming=1, decoupled=2),
          "tau: a fragment sent at step t is applied after step t+tau",
          domains.nonneg(),
      ),
      alpha=(
          0.0,
          "theta_p <- alpha*theta_local + (1-alpha)*theta_global on arrival",
          domains.unit(),
      ),
      delivery=(
          Auto("replace", decoupled="rebase"),
          "what a merged fragment does to a learner: replace (its fragment, progress since its "
          "last upload lost) | rebase (keeps the progress the merge lacks) | at_own_sync (held "
          "until tau steps after the learner's own next upload)",
          domains.among_of("diloco.outer.learner.learner", "DELIVERIES"),
      ),
      anchor=(
          "base",
          "outer gradients against: base (the version the learner started from) | global (the "
          "synchronizer's fragment when the upload arrives; learners send their values)",
          domains.among_of("diloco.outer.policies", "ANCHORS"),
      ),
      codec=(
          Auto("fp32", diloco="fp32", streaming="fp4", decoupled="fp4"),
          "outer gradients on the wire: fp32 | bf16 | int8 | fp4 | 2bit | 1bit",
          domains.among_of("diloco.outer.codecs.compression", "CODECS", CODEC_WHY),
      ),
      # linear won the precision ablation (notebooks/decoupled_ablations.py)
      fp4_rounding=(
          "linear",
          "fp4 uplink: linear (nearest) | log (nearest in log2) | stochastic",
          domains.among_of(
              "diloco.outer.codecs.compression",
              "ROUNDINGS",
              "unknown rounding; expected one of {names}",
          ),
      ),
      error_feedback=(False, "learners add what the codec dropped to their next upload"),
      downlink_codec=(
          "",
          "merged updates sent back; '' = same as codec",
          domains.among_of("diloco.outer.codecs.compression", "CODECS", CODEC_WHY, extra=("",)),
      ),
      optimizer=(
          "nesterov",
          "outer optimizer: nesterov | sgd | delayed_nesterov",
          domains.among_of("diloco.outer.optimizers", "NAMES"),
      ),
      lr=(
          # the Decoupled preset (rebase, period clock) wants a smaller outer rate: its best in the
          # README main job is 0.2 (issue 69's table d; 0.1 under the arrival clock, issue 51)
          Auto(0.4, decoupled=0.2),
          "outer learning rate (0.4 beat 0.7 and 1.0 here, BENCHMARKS.md; the Decoupled preset: "
          "0.2)",
          domains.positive(),
      ),
      momentum=(0.9, "outer Nesterov momentum", domains.unit_open()),
      delayed_period=(4, "delayed_nesterov: momentum every N merges", domains.count()),
      delayed_c=(
          0.0,
          "delayed_nesterov: c (0: plain SGD between momentum updates)",
          domains.unit(),
      ),
      quorum=(
          Auto(0, diloco=0, streaming=0, decoupled=1),
          "K: merge once K learners uploaded; 0 = all learners (every member; with "
          "elastic, only the live ones)",
          domains.where(lambda v, c: 0 <= v <= c.outer.learners, "must be in 0..outer.learners"),
      ),
      grace_gamma=(
          Auto(0.0, diloco=0.0, streaming=0.0, decoupled=0.8),
          ">0: adaptive grace window gamma*(tau*step - quorum - sync) after " "quorum",
          domains.nonneg(),
      ),
      weighting=(
          Auto("equal", diloco="equal", streaming="equal", decoupled="tokens"),
          "equal | tokens (w = tokens * tokens / steps)",
          domains.among_of("diloco.outer.policies", "WEIGHTINGS", "one of {names}"),
      ),
      merge=(
          Auto("mean", diloco="mean", streaming="mean", decoupled="rda"),
          "mean | rda (radial-directional averaging; embeddings always by mean)",
          domains.among_of("diloco.outer.policies", "MERGES"),
      ),
      merge_clock=(
          # Decoupled: period, by issue 69's evidence (BENCHMARKS "The merge clock": it wins the
          # main job and the scavenging goal at one rate; arrival wins the heterogeneous table)
          Auto("arrival", decoupled="period"),
          "when a fragment merges: arrival (its quorum, then the grace window) | period (once "
          "per H steps of the K-th fastest live learner's pace; docs/algorithms.md)",
          domains.among_of("diloco.outer.sync.merge_clock", "CLOCKS"),
      ),
      merge_scale=(
          "one",
          "a merge's outer step: one (whole) | tokens (its share of a full round's expected "
          "tokens: a fractional Nesterov step)",
          domains.among_of("diloco.outer.sync.merge_clock", "SCALES"),
      ),
      ema_decay=(
          0.9,
          "of the step, quorum and sync times behind the grace window",
          domains.unit_open(),
      ),
      max_staleness=(
          Auto(1 << 20, derive=resolve.max_staleness),
          "contributions more versions behind are dropped (preset with " "chaos: 4M)",
          domains.nonneg(),
      ),
      staleness_damping=(
          Auto(False, decoupled=True),
          "scale merges by the mean 1/(1+staleness) of their uploads",
      ),
      broadcast=(
          "all",
          "a merge goes to all live learners | contributors (async Local-SGD)",
          domains.among_of("diloco.outer.policies", "BROADCASTS"),
      ),
      restart_window_s=(
          0.0,
          "broadcast=contributors, blocking: a merge's contributors wait up to this long for "
          "others, then all waiting restart together from the newest model (async Local-SGD's "
          "toy); cut short once every live learner waits",
          domains.nonneg(),
      ),
      fresh_inner_optimizer=(
          False,
          "each restart from a merge holding the learner's upload starts a fresh inner optimizer "
          "(Async Local-SGD's toy; one fragment)",
      ),
      schedule_by=(
          "own",
          "own | global: at each such restart the inner schedule is at the steps all learners "
          "merged / learners (the toy's data progress; one fragment)",
          domains.among(("own", "global"), "expected own or global"),
      ),
      dylu=(False, "DyLU: learner m syncs every floor(v_m/v_max * H) steps, speeds measured"),
      blocking=(
          Auto(True, diloco=True, streaming=True, decoupled=False),
          "learners wait for a fragment tau steps after sending it (synchronous)",
      ),
      elastic=(
          False,
          "quorum=0 only: crashed learners leave the quorum (else merges wait for them)",
      ),
      outlier_factor=(
          100.0,
          "reject outer gradients with norm > factor x recent median (x k/H for one carrying k > H "
          "steps); 0 = off",
          domains.nonneg("0: off"),
      ),
      outlier_history=(4, "norms of a fragment the outlier median is taken over", domains.count()),
      outlier_window=(16, "norms before the fragment's median is used", domains.nonneg()),
      clip_factor=(
          Auto(0.0, decoupled=4.0),
          ">0: scale outer gradients above clip_factor x that median down to it",
          domains.nonneg("0: off"),
      ),
      learner_checkpoint_every=(
          Auto(0, derive=resolve.learner_checkpoint_every),
          "learner checkpoints every N inner steps (0 = none; " "preset with chaos: H)",
          domains.nonneg("0: none"),
      ),
      sync_checkpoint_every=(
          Auto(0, derive=resolve.sync_checkpoint_every),
          "synchronizer checkpoints every N merges (0 = none, a gRPC synchronizer: 1; preset "
          "with chaos: P)",
          domains.nonneg("0: none"),
      ),
      sync_save_share=(
          0.25,
          "a gRPC synchronizer saves off its lock, on a thread of its own, at most this share of"
          " the time: a save starts no sooner than the last one's duration / share after it began"
          " (each save writes only the fragments merged since the last)",
          domains.where(lambda v, c: 0 < v <= 1, "must be in (0, 1]"),
      ),
      sync_shards=(
          1,
          "S synchronizer shards: each owns the fragments given it (balanced by bytes), "
          "merges, checkpoints and restarts on its own",
      ),
      stack_learners=(
          "auto",
          "virtual runtime: on (learners' states stacked, stepped together) | off (one after"
          " the other) | auto: off on CPUs, where it measured faster, on on accelerators",
          domains.among(("auto", "on", "off"), "expected auto, on or off"),
      ),
      stack_step=(
          "auto",
          "stacked: vmap | map (one after the other) | auto (map on CPU)",
          domains.among_of(
              "diloco.inner.stacked", "STEPS", "expected auto, vmap or map", ("auto",)
          ),
      ),
  )
