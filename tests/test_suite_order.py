"""The suite's file order (conftest.py's LONGEST_FIRST) names real files, and the README's test
command keeps it: without `--no-loadscope-reorder` pytest-xdist reorders files by test count."""

import pathlib
import re

import conftest

HERE = pathlib.Path(__file__).resolve().parent


def test_every_file_of_the_order_exists_once():
  missing = [name for name in conftest.LONGEST_FIRST if not (HERE / name).is_file()]
  assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}"
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_the_readme_command_keeps_the_order():
  readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
  command = re.findall(r"^python3 -m venv .*-m pytest .*$", readme, flags=re.M)
  assert len(command) == 1 and "--dist loadfile --no-loadscope-reorder" in command[0], command


def test_collection_puts_the_longest_files_first(request):
  """This session's items, as collected: listed files before unlisted ones, in the listed order."""
  names = [item.path.name for item in request.session.items]
  listed = [n for n in dict.fromkeys(names) if n in conftest.LONGEST_FIRST]
  assert listed == [n for n in conftest.LONGEST_FIRST if n in listed]
  first_unlisted = next((i for i, n in enumerate(names) if n not in conftest.LONGEST_FIRST), None)
  if first_unlisted is not None:
    assert not set(names[first_unlisted:]) & set(conftest.LONGEST_FIRST)
