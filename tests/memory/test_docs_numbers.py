"""The memory numbers the docs print are the code's: docs/memory.md's case sections (and the GB figures of
their summary) are what benchmarks/memory_cases.py prints, and its example refusal (and README's, which
quotes it) is what the dry run of its command says."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys

from tests.conftest import ROOT, assert_refused, check_main

MEMORY_MD = ROOT / "docs/memory.md"


def memory_cases():
    spec = importlib.util.spec_from_file_location("memory_cases", ROOT / "benchmarks/memory_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_case_sections_and_their_summary_are_what_memory_cases_prints():
    doc = MEMORY_MD.read_text()
    cases = memory_cases()
    first = doc.index(f"### {cases.CASES[0].title}\n")
    tables = cases.cases_markdown()
    # Regenerate: python benchmarks/memory_cases.py, pasted over the page from its first case on.
    assert doc[first:].rstrip("\n") == tables.rstrip("\n")
    # The summary above the cases: every GB figure it states is one the case tables print, or one of the
    # what-ifs summary_figures computes, which it states as computed.
    summary = " ".join(doc[doc.index("**What fp32 master weights cost"):first].split())
    extras = cases.summary_figures()
    for phrase in extras.values():
        assert phrase in summary, phrase
    printed = set(re.findall(r"\d+\.\d+", tables)) | {re.match(r"[\d.]+", v).group() for v in extras.values()}
    stated = re.findall(r"(\d+\.\d+) GB", summary)
    assert stated and not [gb for gb in stated if gb not in printed], [gb for gb in stated if gb not in printed]


def example_refusal() -> tuple[list[str], str]:
    """docs/memory.md's "Reading a refusal" block: the command's overrides and the line it shows."""
    doc = MEMORY_MD.read_text()
    block = doc[doc.index("## Reading a refusal"):].split("```")[1]
    command, line = block.strip().rsplit("\n", 1)
    args = shlex.split(command.replace("\\\n", " ").removeprefix("$ "))
    assert args[:2] == ["python", "main_ppo.py"]
    return args[2:], line


def test_the_example_refusal_is_what_its_dry_run_says(tmp_path):
    overrides, line = example_refusal()
    result = check_main(*overrides, cwd=ROOT)
    assert_refused(result)
    assert result.line == line
    # README quotes its start.
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"^(error: update_actor needs .*) \.\.\.$", readme, re.M)
    assert quoted and line.startswith(quoted.group(1)), quoted


def test_the_sequence_parallel_table_is_the_plans(data_files):
    from logicrl.memory.phases import GB
    from logicrl.memory.planner import plan_inputs
    from tests.memory.test_plan_sequence_parallel import seed_001

    doc = MEMORY_MD.read_text()
    section = doc[doc.index("### Sequence parallelism"):doc.index("## The model")]
    rows = re.findall(r"^\| (\d) \| ([\d.]+) GB \| ([\d.]+) GB \| ([\d.]+) GB \|", section, re.M)
    assert [r[0] for r in rows] == ["1", "2", "4"]
    for sp, *shown in rows:
        plan = seed_001(data_files, int(sp))
        assert shown == [f"{plan.phase(p).total / GB:.1f}" for p in ("generate", "ref", "update_actor")], sp
    one = seed_001(data_files, 1)
    ckpt = plan_inputs(one.inputs.with_model("actor", ckpt=True), one.capacity).phase("update_actor").total
    assert f"With gradient checkpointing SP 1 fits too (update_actor {ckpt / GB:.1f} GB)" in section
