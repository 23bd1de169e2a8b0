"""The suite's file order and slow tier (conftest.py, from durations.json) name real tests, and
the README's test command keeps the order: without `--no-loadscope-reorder` pytest-xdist reorders
files by test count."""

import pathlib
import re
import sys

import conftest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
import record_durations  # pylint: disable=wrong-import-position


def test_every_recorded_file_exists():
  missing = [name for name in conftest.LONGEST_FIRST if not (HERE / name).is_file()]
  assert not missing, f"tests/durations.json names files that are gone: {missing}"
  assert conftest.LONGEST_FIRST[0] == max(conftest.FILE_SECONDS, key=conftest.FILE_SECONDS.get)


def test_the_readme_command_keeps_the_order():
  readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
  command = re.findall(r"^python3 -m venv .*-m pytest .*$", readme, flags=re.M)
  assert len(command) == 1 and "--dist loadfile --no-loadscope-reorder" in command[0], command
  assert record_durations.COMMAND in command[0]


def test_collection_puts_the_longest_files_first(request):
  """This session's items, as collected: listed files before unlisted ones, in the listed order."""
  names = [item.path.name for item in request.session.items]
  listed = [n for n in dict.fromkeys(names) if n in conftest.LONGEST_FIRST]
  assert listed == [n for n in conftest.LONGEST_FIRST if n in listed]
  first_unlisted = next((i for i, n in enumerate(names) if n not in conftest.LONGEST_FIRST), None)
  if first_unlisted is not None:
    assert not set(names[first_unlisted:]) & set(conftest.LONGEST_FIRST)


def test_recorded_slow_tests_are_marked(request):
  """Every collected test recorded at SLOW_S seconds or more carries `slow`; no other does, but
  one its file declares slow itself (tests sharing a slow module fixture: the fixture's time is
  recorded on the first of them only)."""
  for item in request.session.items:
    slow = conftest.DURATIONS["seconds"].get(item.nodeid, 0.0) >= conftest.SLOW_S
    declared = any(m.name == "slow" for m in getattr(item.function, "pytestmark", []))
    assert (item.get_closest_marker("slow") is not None) == (slow or declared), item.nodeid


def test_a_junit_report_becomes_node_ids(tmp_path):
  """A function, a parametrised case and a class's method, as pytest's junit XML names them."""
  (tmp_path / "run.xml").write_text(
      '<testsuites><testsuite name="pytest">'
      '<testcase classname="tests.test_a" name="test_one" time="1.26"/>'
      '<testcase classname="tests.test_a" name="test_two[x-1]" time="0.04"/>'
      '<testcase classname="tests.test_b.TestThing" name="test_three" time="12.0"/>'
      "</testsuite></testsuites>"
  )
  assert record_durations.seconds(tmp_path / "run.xml") == {
      "tests/test_a.py::test_one": 1.3,
      "tests/test_a.py::test_two[x-1]": 0.0,
      "tests/test_b.py::TestThing::test_three": 12.0,
  }
