"""`ran_code_mismatch`: the file `__main__.__file__` names is checked against the code that runs as `__main__`, so
a script that points `__file__` at an innocent copy is caught. Each check runs a small script in a new Python
process (no torch, no run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HONEST = """\
import sys
from pathlib import Path
from veritrain.userloop.script import ran_code_mismatch


def square_sum(n):
    assert n >= 0, "only counts"
    return sum(i * i for i in range(n))


for _ in range(1000):  # the running code is specialised as it warms up; it still compares equal
    square_sum(10)
print(ran_code_mismatch(Path(__file__)))
"""

DEEPER = """\
import sys
from pathlib import Path
from veritrain.userloop.script import ran_code_mismatch


class Trainer:
    def start(self):
        return ran_code_mismatch(Path(sys.modules["__main__"].__file__))


def main():
    return [Trainer().start() for _ in range(1)][0]


print(main())
"""

SPOOFING = """\
import sys
from pathlib import Path
from veritrain.userloop.script import ran_code_mismatch

innocent = Path(__file__).with_name("innocent_copy.py")
innocent.write_text("print('an honest day of training')\\n")
sys.modules["__main__"].__file__ = str(innocent)
print(ran_code_mismatch(Path(sys.modules["__main__"].__file__)))
"""

RUNPY_DRIVER = """\
import runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def _output(tmp_path: Path, source: str, *options: str, driver: bool = False) -> str:
    """What the script prints when run with `python *options` (through `runpy.run_path` where `driver`)."""
    script = tmp_path / "train.py"
    script.write_text(source)
    command = [sys.executable, *options, str(script)]
    if driver:
        (tmp_path / "driver.py").write_text(RUNPY_DRIVER)
        command = [sys.executable, *options, str(tmp_path / "driver.py"), str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_honest_script_runs_the_file_it_names(tmp_path):
    assert _output(tmp_path, HONEST) == "None"


def test_a_script_that_names_an_innocent_copy_is_caught(tmp_path):
    said = _output(tmp_path, SPOOFING)
    assert said.startswith("the code running as __main__ is not the recorded file innocent_copy.py"), said


def test_a_script_run_through_runpy_run_path_is_its_own_code(tmp_path):
    """As a replay runs the recorded copy (veritrain.userloop.launch): runpy's own `__main__` module, not the
    driver's, is the one compared."""
    assert _output(tmp_path, HONEST, driver=True) == "None"
    assert _output(tmp_path, SPOOFING, driver=True).startswith("the code running as __main__ is not")


def test_the_check_finds_the_script_from_inside_its_functions(tmp_path):
    assert _output(tmp_path, DEEPER) == "None"


def test_optimised_scripts_compare_with_the_same_optimisation(tmp_path):
    """`-O` drops the asserts and `-OO` the docstrings too: the file is compiled as the running code was."""
    assert _output(tmp_path, HONEST, "-O") == "None"
    assert _output(tmp_path, HONEST + '"""a docstring"""\n', "-OO") == "None"


def test_a_file_that_does_not_compile_is_a_mismatch(tmp_path):
    source = SPOOFING.replace("print('an honest day of training')", "def broken(:")
    assert _output(tmp_path, source).startswith("the code running as __main__ is not the recorded file")


def test_a_check_from_another_thread_looks_at_the_main_threads_stack(tmp_path):
    threaded = "import threading\nfound = []\n" + SPOOFING.replace(
        "print(ran_code_mismatch(Path(sys.modules[\"__main__\"].__file__)))",
        "worker = threading.Thread(target=lambda: found.append(ran_code_mismatch(Path(sys.modules['__main__'].__file__))))\n"
        "worker.start()\nworker.join()\nprint(found[0])")
    assert _output(tmp_path, threaded).startswith("the code running as __main__ is not the recorded file innocent_copy.py")


def test_without_a_module_frame_nothing_is_claimed(tmp_path):
    """Once the script's module code has finished (here: at exit) no frame runs it: None, not a mismatch."""
    at_exit = HONEST.replace("print(ran_code_mismatch(Path(__file__)))",
                             "import atexit\nfile = Path(__file__)\natexit.register(lambda: print(ran_code_mismatch(file)))")
    assert _output(tmp_path, at_exit) == "None"


def test_code_given_with_python_c_is_not_a_file_it_names(tmp_path):
    """`python -c` runs as `__main__` too: pointing `__file__` at a file does not make that file what runs."""
    (tmp_path / "innocent_copy.py").write_text("x = 1\n")
    code = ("import sys; from pathlib import Path; from veritrain.userloop.script import ran_code_mismatch; "
            "sys.modules['__main__'].__file__ = 'innocent_copy.py'; print(ran_code_mismatch(Path('innocent_copy.py')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("the code running as __main__ is not the recorded file innocent_copy.py"), done.stderr
