"""The synchronizer core: a sans-I/O state machine (no threads, sockets, clocks or sleeps).

It holds, per fragment p, the global values Θ_p, the outer optimizer state and a version. It
consumes events (protocol.Join/Leave/Upload/Tick) and returns actions (protocol.Send/SetTimer/Log).
Every runtime drives the same object, so a bug found in simulation is the bug in production.

Merge of fragment p: once `policy.quorum` uploads of p from live learners are in, wait the grace
window (cut short when every live learner has uploaded), then merge every pending upload of p with
`policy.weights` and `policy.merge`, step the outer optimizer, and send version v+1 to every live
learner. The update Θ_new − Θ_old is sent encoded with the downlink codec, and the synchronizer
itself applies the decoded update, so learners and synchronizer hold bit-identical fragments; the
quantisation error is fed back into the next update of that fragment (error feedback).
"""

from collections.abc import Mapping

import jax
import numpy as np
import optax

from diloco import compression, fragments, merging, policies
from diloco.protocol import Action, Event, Join, Leave, Log, Send, SetTimer, Tick, Upload


class Synchronizer:
    """Global fragments, outer optimizer states and versions; merges by a policy."""

    def __init__(self, params: Mapping[str, np.ndarray], frag: fragments.Fragmentation,
                 policy: policies.Policy, outer_tx: optax.GradientTransformation,
                 downlink_codec: str = "fp32"):
        if downlink_codec not in compression.CODECS:
            raise ValueError(f"unknown downlink codec {downlink_codec!r}")
        flat = fragments.flatten(params)
        frag.check(flat)
        self.frag, self.policy, self.tx, self.codec = frag, policy, outer_tx, downlink_codec
        self._cpu = jax.devices("cpu")[0]
        num = frag.num_fragments
        self.globals = [{k: np.array(flat[k], np.float32) for k in frag.paths[p]} for p in range(num)]
        with jax.default_device(self._cpu):
            self.opt_states = [outer_tx.init(g) for g in self.globals]
        self.residuals = [{k: np.zeros_like(v) for k, v in g.items()} for g in self.globals]
        self.versions = [0] * num
        self.live: set[int] = set()
        self.held: dict[int, list[int]] = {}  # fragment versions each learner was sent
        self.pending: list[dict[int, Upload]] = [{} for _ in range(num)]
        self.first_upload_s: list[float | None] = [None] * num
        self.quorum_s: list[float | None] = [None] * num
        self.deadline_s: list[float | None] = [None] * num
        self.ema_step = policies.Ema(policy.ema_decay)
        self.ema_quorum = policies.Ema(policy.ema_decay)
        self.ema_sync = policies.Ema(policy.ema_decay)

    # ---- events ----

    def handle(self, event: Event) -> list[Action]:
        """Consumes one event and returns what should happen next."""
        if isinstance(event, Upload):
            return self._upload(event)
        if isinstance(event, Tick):
            return self._tick(event.time)
        if isinstance(event, Join):
            return self._join(event)
        if isinstance(event, Leave):
            self.live.discard(event.learner)
            return [a for p in range(self.frag.num_fragments) for a in self._maybe_merge(p, event.time)]
        raise TypeError(f"unknown event {event!r}")

    def _join(self, event: Join) -> list[Action]:
        if len(event.versions) != self.frag.num_fragments:
            return [_reject(event.learner, None, event.time,
                            f"join with {len(event.versions)} versions, expected {self.frag.num_fragments}")]
        self.live.add(event.learner)
        self.held[event.learner] = list(event.versions)
        actions: list[Action] = [Log({"event": "join", "learner": event.learner, "time": event.time})]
        for p, v in enumerate(event.versions):
            if v != self.versions[p]:
                actions.append(self._send(event.learner, p))
        return actions

    def _upload(self, up: Upload) -> list[Action]:
        reason = self._invalid(up)
        if reason:
            return [_reject(up.learner, up.fragment, up.time, reason)]
        p = up.fragment
        self.ema_step.update(up.step_time)
        self.ema_sync.update(2.0 * max(up.time - up.sent_time, 0.0))  # up and back down
        if not self.pending[p]:
            self.first_upload_s[p] = up.time
        self.pending[p][up.learner] = up
        return self._maybe_merge(p, up.time)

    def _invalid(self, up: Upload) -> str | None:
        if not 0 <= up.fragment < self.frag.num_fragments:
            return f"unknown fragment {up.fragment}"
        want = self.globals[up.fragment]
        if sorted(up.delta) != sorted(want):
            return "fragment paths differ from the model's"
        for k, e in up.delta.items():
            if tuple(e.shape) != want[k].shape:
                return f"{k} has shape {tuple(e.shape)}, expected {want[k].shape}"
            if e.nbytes != compression.encoded_nbytes(e.codec, e.num_values, e.block):
                return f"{k}: corrupt {e.codec} payload of {e.nbytes} bytes"
        if up.base_version > self.versions[up.fragment] or up.base_version < 0:
            return f"unknown base version {up.base_version} (current {self.versions[up.fragment]})"
        if self.versions[up.fragment] - up.base_version > self.policy.max_staleness:
            return f"stale: base version {up.base_version}, current {self.versions[up.fragment]}"
        if up.steps <= 0 or up.tokens <= 0:
            return f"no progress to merge: {up.steps} steps, {up.tokens} tokens"
        return None

    def _tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for p, deadline in enumerate(self.deadline_s):
            if deadline is not None and deadline <= now:
                actions += self._merge(p, now)
        return actions

    # ---- merging ----

    def _maybe_merge(self, p: int, now: float) -> list[Action]:
        pending = self.pending[p]
        arrived = len(self.live.intersection(pending))
        if not pending or arrived < self.policy.quorum.required(len(self.live)):
            return []
        if self.quorum_s[p] is None:
            self.quorum_s[p] = now
            self.ema_quorum.update(now - self.first_upload_s[p])
            grace = self.policy.grace.window(self.ema_step.get(), self.ema_quorum.get(),
                                             self.ema_sync.get())
            if grace > 0 and not self.live.issubset(pending):
                self.deadline_s[p] = now + grace
                return [SetTimer(now + grace)]
        elif self.deadline_s[p] is not None and not self.live.issubset(pending):
            return []  # still inside the grace window
        return self._merge(p, now)

    def _merge(self, p: int, now: float) -> list[Action]:
        ups = [self.pending[p][m] for m in sorted(self.pending[p])]
        deltas = [{k: _read_only(e) for k, e in u.delta.items()} for u in ups]
        bad = [u.learner for u, d in zip(ups, deltas) if not all(np.isfinite(x).all() for x in d.values())]
        if bad:  # a non-finite contribution never reaches the global state
            keep = [i for i, u in enumerate(ups) if u.learner not in bad]
            rejects = [_reject(m, p, now, "non-finite values") for m in bad]
            ups, deltas = [ups[i] for i in keep], [deltas[i] for i in keep]
            for m in bad:
                del self.pending[p][m]
            if not ups:
                self._reset_round(p)
                return rejects
        else:
            rejects = []
        weights = self.policy.weights([u.tokens for u in ups], [u.steps for u in ups])
        merged = merging.merge_fragment(deltas, weights, rule=self.policy.merge)
        old = self.globals[p]
        with jax.default_device(self._cpu):
            updates, self.opt_states[p] = self.tx.update(merged, self.opt_states[p], old)
        raw = {k: np.asarray(updates[k], np.float32) + self.residuals[p][k] for k in old}
        encoded = compression.encode_tree(raw, self.codec)
        decoded = compression.decode_tree(encoded)
        self.globals[p] = {k: old[k] + decoded[k] for k in old}
        self.residuals[p] = {k: raw[k] - decoded[k] for k in old}
        self.versions[p] += 1
        record = {
            "event": "merge", "time": now, "fragment": p, "version": self.versions[p],
            "quorum": len(ups), "learners": [u.learner for u in ups],
            "weights": [float(w) for w in weights / weights.sum()],  # normalised, as merged
            "staleness": [self.versions[p] - 1 - u.base_version for u in ups],
            "grace_s": now - self.quorum_s[p] if self.quorum_s[p] is not None else 0.0,
            "steps": [u.steps for u in ups], "tokens": [u.tokens for u in ups],
        }
        self._reset_round(p)
        actions: list[Action] = rejects + [Log(record)]
        for m in sorted(self.live):
            actions.append(self._send(m, p, encoded))
        return actions

    def _reset_round(self, p: int) -> None:
        self.pending[p] = {}
        self.first_upload_s[p] = self.quorum_s[p] = self.deadline_s[p] = None

    def _send(self, learner: int, p: int, update=None) -> Send:
        held = self.held.setdefault(learner, [-1] * self.frag.num_fragments)
        v = self.versions[p]
        send = (Send(learner, p, v, update=update) if update is not None and held[p] == v - 1
                else Send(learner, p, v, values={k: x.copy() for k, x in self.globals[p].items()}))
        held[p] = v
        return send

    # ---- views ----

    def global_params(self) -> dict[str, np.ndarray]:
        """All global fragments as one path-keyed dict."""
        return {k: v for g in self.globals for k, v in g.items()}

    @property
    def merges(self) -> int:
        return int(sum(self.versions))


def _reject(learner: int, fragment: int | None, time: float, reason: str) -> Log:
    return Log({"event": "reject", "learner": learner, "fragment": fragment, "time": time,
                "reason": reason})


def _read_only(e: compression.Encoded) -> np.ndarray:
    """Decoded values to merge; fp32 payloads are viewed in place, not copied."""
    if e.codec == "fp32":
        return np.frombuffer(e.payload, "<f4").reshape(e.shape)
    return compression.decode(e)


def apply_send(global_copy: Mapping[str, np.ndarray], send: Send) -> dict[str, np.ndarray]:
    """A learner's new copy of the global fragment after receiving `send`."""
    if send.update is None:
        return {k: np.array(v, np.float32) for k, v in send.values.items()}
    decoded = compression.decode_tree(send.update)
    return {k: global_copy[k] + decoded[k] for k in global_copy}


def outer_gradient(global_copy: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray],
                   codec: str) -> dict[str, compression.Encoded]:
    """Δ = Θ_base − θ_local, encoded for the wire."""
    return compression.encode_tree(
        {k: np.asarray(global_copy[k], np.float32) - np.asarray(local[k], np.float32)
         for k in global_copy}, codec)
