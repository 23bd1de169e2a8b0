"""A held-out Shakespeare task in the harness's format: how does this line end? Built from the
validation split's plays only (data/shakespeare.py: hamlet, henry_v, tempest, twelfth_night),
deterministically, and shipped as a local task folder (TASK_DIR).

An item is a line of a speech cut at a seeded place in its middle third (most often inside a
word). The context is the line before it in the same speech, a newline, and the cut line's head;
the choices are the head's true tail and the tails of three other lines of the same play, each
the same number of bytes (so that no choice wins by its length: acc and acc_norm agree). Only
ASCII lines of 24 to 48 bytes that never occur in the training split are used, the distractors'
too, so that no item is answered, or misled, by memorising the training text. Chance is 0.25.

A task our scale can move: the first version, the true next line among four lines of the same
play, left the README main job's three 28,832-parameter models at chance (acc_norm 0.254, 0.248,
0.231, 1,000 items; BENCHMARKS.md); a line's end needs the word and the metre it is in.

  python -m diloco.harness.shakespeare_task   # rewrites TASK_DIR from the prepared corpus
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

TASK = "shakespeare_line_end"
TASK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks", TASK)
ITEMS_FILE = "items.jsonl"
ITEMS_PER_PLAY = 250
SHORTEST, LONGEST = 24, 48  # bytes of a cut line
SEED = 1606  # of every draw: the shipped items are pinned by it
_SPEAKER = re.compile(r"^[A-Z][A-Za-z ]*\.$")  # "Hor.", "First Clown." (a speech's heading)

YAML = f"""\
# How a line of a speech ends, among four tails of lines of the same play, from the validation plays
# only (shakespeare_task.py builds {ITEMS_FILE}; data_files are read relative to this file).
task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {ITEMS_FILE}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def _verse(line: str) -> bool:
  """A line of a speech: not blank, not a speaker's heading, not a stage direction."""
  s = line.strip()
  return bool(s) and not _SPEAKER.match(s) and not s.startswith("[")


def build_items(plays: list[tuple[str, str]], train_text: str) -> list[dict]:
  """ITEMS_PER_PLAY items of each play (name, text), in play order then line order."""
  rng = np.random.default_rng(SEED)
  seen = set(train_text.split("\n"))  # the training split's lines
  items = []
  for name, text in plays:
    lines = text.split("\n")
    fit = [
        (i, l)
        for i, l in enumerate(lines)
        if _verse(l) and l.isascii() and SHORTEST <= len(l) <= LONGEST and l not in seen
    ]  # fmt: skip
    pairs = [(lines[i - 1], l) for i, l in fit if i > 0 and _verse(lines[i - 1])]
    chosen = sorted(rng.choice(len(pairs), size=min(ITEMS_PER_PLAY, len(pairs)), replace=False))
    for k in chosen:
      before, line = pairs[k]
      cut = int(rng.integers(len(line) // 3, 2 * len(line) // 3 + 1))
      tail = line[cut:]
      pool = sorted({l[-len(tail) :] for _, l in fit if l != line and len(l) > len(tail)} - {tail})
      distractors = [pool[j] for j in rng.choice(len(pool), size=3, replace=False)]
      label = int(rng.integers(4))
      choices = distractors[:label] + [tail] + distractors[label:]
      context = f"{before}\n{line[:cut]}"
      items.append({"play": name, "context": context, "choices": choices, "label": label})
  return items


def validation_plays(corpus) -> list[tuple[str, str]]:
  """(name, text) of each validation play of a prepared corpus (data/shakespeare.py)."""
  val = corpus.val_tokens
  return [(p.name, bytes(val[p.offset : p.offset + p.length]).decode()) for p in corpus.val_plays]


def write(directory: str = TASK_DIR) -> int:
  """Writes the task folder from the prepared corpus; the number of items."""
  from diloco.data import shakespeare

  corpus = shakespeare.ensure_prepared()
  items = build_items(validation_plays(corpus), bytes(corpus.train_tokens).decode())
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f"{TASK}.yaml"), "w") as f:
    f.write(YAML)
  with open(os.path.join(directory, ITEMS_FILE), "w") as f:
    f.writelines(json.dumps(item, sort_keys=True) + "\n" for item in items)
  return len(items)


if __name__ == "__main__":
  print(f"{write()} items in {TASK_DIR}")
