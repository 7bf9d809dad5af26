"""Every command README.md and docs/ show is run by a test, so a page cannot drift from the code it describes.

A command (a line of a shell block that starts with a program the project uses, or a `$ ` prompt) runs here when it
takes seconds and needs no cluster: the dry runs, the errors the pages show, `--help` for a synopsis with
placeholders, the docs check; where the page shows its output (the lines after a `$ ` prompt), the output must be
those lines (`...` ends a line the page shortens). A longer command names the test that runs it, shortened (the
quickstart, the miniature, the two-node rehearsal); a command that needs what CI has not (a cloud account, a GPU,
a package index other than PyPI) says so. A command that no rule covers fails the suite: a new page line needs its
test.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAMS = ("python ", "raybiphase ", "pip ", "ray ", "kubectl ", "aws ", "export ", "moto_server ", "unshare ",
            *(f"cluster/{script}" for script in ("make-token.sh", "aws-roles.sh", "gcp-roles.sh", "pin-images.sh",
                                                 "lock.sh")))


@dataclass(frozen=True)
class Shown:
    page: str
    command: str
    output: tuple[str, ...]  # the lines a `$ ` prompt is followed by


def shown() -> list[Shown]:
    """Each command of each page's shell blocks, without its trailing comment."""
    out = []
    for page in PAGES:
        for block in re.findall(r"^```(?:bash|sh|console|shell)?\n(.*?)^```", page.read_text(), re.S | re.M):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                prompt = line.startswith("$ ")
                text = line[2:] if prompt else line
                if not (prompt or text.startswith(PROGRAMS)):
                    continue
                output = tuple(takewhile_output(lines[i + 1:])) if prompt else ()
                command = re.split(r"\s+#\s", text, maxsplit=1)[0].strip()
                out.append(Shown(page.relative_to(REPO).as_posix(), command, output))
    return out


def takewhile_output(lines: list[str]) -> list[str]:
    taken = []
    for line in lines:
        if line.startswith("$ "):
            break
        taken.append(line)
    return taken


# ------------------------------------------------------------------------------------------------ the rules

RUN = "run here"
HELP = "--help"
QUICKSTART_ON_TWO_NODES = ("tests/test_multinode.py::test_the_quickstart_crosses_only_through_the_bucket_and_a_spot_"
                           "notice_costs_only_the_steps_since_the_drain")


def _test(node: str) -> str:
    return f"test {node}"


def _needs(reason: str) -> str:
    return f"needs {reason}"


RULES: list[tuple[str, str]] = [  # (a regex the whole command matches, how it is run); the first match counts
    # run here: seconds, no Ray
    (r"(python -m raybiphase\.sweep|raybiphase sweep) sweeps/\w+\.yaml --dry-run( --set \S+)?( 2>&1)?"
     r"( \| (tail -\d+|grep -A\d+ \"\^[\w-]+\"))?", RUN),
    (r"python -m raybiphase\.sweep sweeps/quickstart\.yaml --set phases\.(mask_ratoi=0\.3|mask_ratio=1\.5)", RUN),
    (r"raybiphase docs \[--check\]", RUN),
    (r"raybiphase spot-watch --cloud aws\|gcp", _test("tests/test_spot.py")),
    (r"raybiphase (\w+) .*\b(CONFIG|MODEL|CHECKPOINT|TREE|RESULTS)\b.*|raybiphase assets fetch \| verify", HELP),
    # run by a test, shortened where it would take minutes
    (r"pip install -c constraints\.txt -e '\.\[dev\]' && python -m pytest", _test(".ci/run")),
    (r"pip install -c constraints\.txt -e \. && python -m raybiphase assets fetch && "
     r"python -m raybiphase\.sweep sweeps/quickstart\.yaml", _test(QUICKSTART_ON_TWO_NODES)),
    (r"pip install -c constraints\.txt -e \.", _test(".ci/run")),
    (r"python -m raybiphase assets fetch", _test("tests/data/test_assets.py")),
    (r"(python -m raybiphase\.sweep|raybiphase sweep) sweeps/quickstart\.yaml",
     _test(QUICKSTART_ON_TWO_NODES)),
    (r"raybiphase report results/quickstart", _test("tests/results/test_report.py")),
    (r"raybiphase repair (SPEC|sweeps/quickstart\.yaml).*", _test(
        "tests/sweep/test_beyond_study.py::test_repair_moves_damaged_parts_and_records_aside_and_writes_back_what_the"
        "_journals_hold")),
    (r"python -m raybiphase\.sweep sweeps/quickstart\.yaml --set sweep\.wandb_project=my-study",
     _test("tests/sweep/test_driver.py::test_resumed_sweep_skips_the_finished_segment_and_writes_each_row_once")),
    (r"(python -m raybiphase\.sweep|raybiphase sweep) sweeps/paper_mini\.yaml",
     _test("tests/sweep/test_paper_mini.py::test_the_shortened_miniature_reports_per_size_what_its_rows_imply")),
    # the local rehearsal of a cluster: the two-node test starts the same head, worker node, bucket and job
    (r"cluster/make-token\.sh|export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/\.raybiphase/ray-token|"
     r"moto_server .*|export AWS_ENDPOINT_URL=.*|python -c \"import boto3; .*|ray start --head .*|unshare -m .*|"
     r"ray job submit --address http://127\.0\.0\.1:8266 .*|ray stop --force",
     _test("tests/test_multinode.py::test_a_job_without_the_clusters_token_is_refused_and_one_with_it_runs")),
    # what CI cannot run
    (r"raybiphase report results/quickstart --wandb my-lab/my-study",
     _needs("a W&B account; tests/results/test_wandb_report.py builds the report's spec offline")),
    (r"ray (up|down|dashboard|exec) cluster/\w+\.yaml.*|aws iam .*|kubectl .*|cluster/(aws|gcp)-roles\.sh .*|"
     r"ray job (submit|logs|list) --address http://127\.0\.0\.1:8265.*", _needs("a cloud account and its cluster")),
    (r"ray job submit --working-dir \. -- python -m raybiphase\.sweep sweeps/split_grid\.yaml|"
     r"--set sweep\.storage=(s3|gs)://YOUR_BUCKET/raybiphase", _needs("a GPU cluster and a bucket")),
    (r"python -m raybiphase\.sweep sweeps/(split_grid|gpu)\.yaml|pip install -c constraints\.txt -e '\.\[gpu\]'|"
     r"python benchmarks/bench_(train|finetune)_gpu\.py .*", _needs("a GPU")),
    (r"cluster/pin-images\.sh", _needs("a container registry (crane or docker buildx); tests/test_cluster.py checks "
                                        "that every image is pinned or one it pins")),
    (r"cluster/lock\.sh", _needs("uv and the package index; it rewrites the committed locks, which "
                                 "tests/test_cluster.py checks")),
    (r"pip install .*--extra-index-url https://download\.pytorch\.org/whl/cpu.*|pip install --no-deps -e \.",
     _needs("the PyTorch package index (CI reaches PyPI only), for the lock's CPU torch")),
    (r"python benchmarks/environment\.py check", _test("tests/test_benchmarks.py")),
]


def rule(command: str) -> str | None:
    return next((how for pattern, how in RULES if re.fullmatch(pattern, command)), None)


def test_every_command_the_pages_show_is_run_by_a_test_or_says_what_it_needs():
    commands = shown()
    assert len(commands) > 40 and {c.page for c in commands} >= {"README.md", "docs/sweeps.md", "docs/cluster.md"}
    unmatched = [f"{c.page}: {c.command}" for c in commands if rule(c.command) is None]
    assert not unmatched, "no test runs these commands:\n" + "\n".join(unmatched)


def test_every_test_a_command_names_exists():
    for how in {how for _, how in RULES if how.startswith("test ")}:
        path, _, name = how.removeprefix("test ").partition("::")
        assert (REPO / path).exists(), how
        assert not name or f"def {name}(" in (REPO / path).read_text(), how


# ------------------------------------------------------------------------------------------------ running them


@functools.cache
def _output(command: str) -> tuple[int, str]:
    """The exit status and output (stdout, then stderr) of a page's command without its pipe, run in the checkout."""
    argv = shlex.split(command)
    if argv[0] == "raybiphase":
        argv = [sys.executable, "-m", "raybiphase", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _piped(command: str) -> list[str]:
    """The lines a command prints, through the page's pipe (`tail -N`, `grep -AN "^word"`)."""
    base, _, pipe = command.partition(" | ")
    code, text = _output(base.replace(" 2>&1", ""))
    lines = text.splitlines()
    if pipe.startswith("tail -"):
        return lines[-int(pipe.split("-")[1]):]
    if pipe.startswith("grep -A"):
        after, word = re.fullmatch(r'grep -A(\d+) "\^([\w-]+)"', pipe).groups()
        start = next(i for i, line in enumerate(lines) if line.startswith(word))
        return lines[start:start + int(after) + 1]
    return lines


def _same(shown_line: str, printed: str) -> bool:
    if shown_line.endswith("..."):
        return printed.startswith(shown_line[:-3].rstrip(" ,(").rstrip())
    return printed == shown_line


@pytest.mark.slow  # several dry runs of the paper's grid
@pytest.mark.parametrize("item", [c for c in shown() if rule(c.command) == RUN],
                         ids=lambda c: f"{c.page}: {c.command[:70]}")
def test_a_command_the_pages_run_here_works_and_prints_what_they_show(item: Shown):
    if item.command.startswith("raybiphase docs"):
        code, text = _output("raybiphase docs --check")
        assert code == 0, text
        return
    code, _ = _output(item.command.partition(" | ")[0].replace(" 2>&1", ""))
    if not item.output:
        assert code == 0
        return
    printed = _piped(item.command)
    if item.output[0].startswith("error: "):
        assert code == 2 and len(printed) >= 1
        printed = printed[-1:]
    shown_lines = [line for line in item.output if line.strip()]
    assert len(printed) >= len(shown_lines), (item.page, printed)
    wrong = [(s, p) for s, p in zip(shown_lines, printed) if not _same(s, p)]
    assert not wrong, f"{item.page} shows, for {item.command}:\n" + "\n".join(f"  {s}\nprints:\n  {p}" for s, p in wrong)


@pytest.mark.parametrize("command", sorted({re.match(r"raybiphase (\w+)", c.command)[1] for c in shown()
                                             if rule(c.command) == HELP}))
def test_a_synopsis_the_readme_shows_is_a_command_with_help(command):
    code, text = _output(f"raybiphase {command} --help")
    assert code == 0 and "usage:" in text, text
