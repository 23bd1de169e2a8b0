"""A key's domain (type, range, choices), declared with the key: `name=(value, meaning, domain)`.

`keys.section` records each domain under the key's dotted path (`keys.DOMAINS`), the listing
prints it and `checks` tests every key of a config against its own. Choices the library owns are
named by module and attribute (`among_of`) and read when first checked, so a config file imports
nothing heavy to declare them.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

Test = Callable[[Any, Any], bool]  # (value, the whole config) -> whether the value is allowed


@dataclasses.dataclass(frozen=True)
class Domain:
  """What a key accepts: `test(value, config)`, and the problem's text when it does not."""

  test: Test
  why: str | Callable[[], str]

  def problem(self, value: Any, config: Any) -> str | None:
    """None when `value` is in the domain, else why not (a value of the wrong type is not)."""
    try:
      if self.test(value, config):
        return None
    except TypeError:
      pass
    return self.why() if callable(self.why) else self.why

  def describe(self) -> str:
    return self.why() if callable(self.why) else self.why


def count(why: str = "must be >= 1") -> Domain:
  """An integer >= 1."""
  return Domain(lambda v, c: isinstance(v, int) and v >= 1, why)


def nonneg(note: str = "") -> Domain:
  """A finite number >= 0; `note` says what 0 means."""
  return Domain(lambda v, c: v >= 0 and math.isfinite(v), _note("must be >= 0", note))


def positive(why: str = "must be a positive number") -> Domain:
  """A finite number > 0."""
  return Domain(lambda v, c: v > 0 and math.isfinite(v), why)


def unit() -> Domain:
  """A number in [0, 1]."""
  return Domain(lambda v, c: 0 <= v <= 1, "must be in [0, 1]")


def unit_open() -> Domain:
  """A number in [0, 1)."""
  return Domain(lambda v, c: 0 <= v < 1, "must be in [0, 1)")


def axis() -> Domain:
  """A mesh axis size: -1 (the remaining devices) or >= 1."""
  return Domain(lambda v, c: v == -1 or v >= 1, "must be -1 (the remaining devices) or >= 1")


def among(names: tuple, why: str | None = None) -> Domain:
  """One of `names`; `why` may say it in words ('expected adamw or sgd')."""
  return Domain(lambda v, c: v in names, why or f"expected one of {names}")


def among_of(
    module: str, attribute: str, why: str = "expected one of {names}", extra: tuple = ()
) -> Domain:
  """One of `extra` and the names `module.attribute` holds (a tuple or a dict's keys), read when
  first checked."""

  def names() -> tuple:
    return extra + tuple(getattr(importlib.import_module(module), attribute))

  return Domain(lambda v, c: v in names(), lambda: why.format(names=names()))


def where(test: Test, why: str) -> Domain:
  """Any other test of the value, which may read the rest of the config."""
  return Domain(test, why)


def _note(why: str, note: str) -> str:
  return f"{why} ({note})" if note else why
