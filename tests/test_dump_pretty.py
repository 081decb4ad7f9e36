"""Schedule trees in isl's block style (`tcmlir.pretty`): they read well and re-parse.

The corpus (every program, default options of both targets) is printed in block style and in
the repaired flow style; isl must read both back to the same tree, and printing what it read
must give the same text again.
"""

from __future__ import annotations

import islpy as isl
import pytest
from corpus.programs import CASES

import tcmlir as tc
from tcmlir.compiler import lower
from tcmlir.options import MappingOptions
from tcmlir.pretty import format_schedule

CHILDLESS_MARK = '{ domain: "[N] -> { S0[i] : 0 <= i < N }", child: { mark: "parallel" } }'


def _schedule(case, target: str, sizes=None) -> isl.Schedule:
    fn = tc.define(case.source, case.entry, target="cpu")
    options = MappingOptions.default_for(fn, target)
    return lower(fn.ir, sizes or dict(case.sizes[0]), options, target, verify=False).schedule


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_corpus_schedules_round_trip_in_block_style(target):
    for case in CASES:
        schedule = _schedule(case, target)
        block = format_schedule(schedule)
        flow = format_schedule(schedule, style="flow")
        ctx = isl.Context()
        from_block = isl.Schedule.read_from_str(ctx, block)
        from_flow = isl.Schedule.read_from_str(ctx, flow)
        assert from_block.plain_is_equal(from_flow), case.name
        assert format_schedule(from_block) == format_schedule(from_flow), case.name
        assert format_schedule(block, ctx) == format_schedule(from_block), case.name
        lines = block.splitlines()
        assert lines[0].startswith("domain: ") and lines[1:2] in ([], ["child:"]), case.name
        assert all(not line.endswith(" ") for line in lines), case.name


def test_block_style_is_indented_one_key_per_line():
    case = next(c for c in CASES if c.name == "matmul")
    text = format_schedule(_schedule(case, "cuda", {"M": 128, "N": 128, "K": 64}))
    assert "\n" in text and not text.endswith("\n") and not text.startswith("{")
    keys = {line.strip().lstrip("- ").split(":")[0] for line in text.splitlines()}
    assert {"domain", "child", "mark", "filter", "schedule", "permutable", "coincident",
            "sequence", "extension"} <= keys
    # children are indented by two more columns than their parent key
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == "child:":
            indent = len(line) - len(line.lstrip())
            nxt = lines[i + 1]
            assert len(nxt) - len(nxt.lstrip()) == indent + 2


def test_a_mark_without_child_gets_an_explicit_leaf():
    ctx = isl.Context()
    tree = isl.Schedule.read_from_str(ctx, CHILDLESS_MARK.replace('" }', '", child: { leaf } }'))
    block = format_schedule(tree)
    assert block.splitlines()[-3:] == ['  mark: "parallel"', "  child:", "    leaf"]
    flow = format_schedule(tree, style="flow")
    assert flow.endswith('mark: "parallel", child: { leaf } } }')
    for text in (block, flow):
        assert isl.Schedule.read_from_str(ctx, text).plain_is_equal(tree)


def test_a_marked_leaf_in_a_sequence_keeps_its_siblings():
    text = ('{ domain: "[N] -> { S0[i] : 0 <= i < N; S1[i] : 0 <= i < N }", child: { sequence: '
            '[ { filter: "[N] -> { S0[i] }", child: { mark: "a", child: { leaf } } }, '
            '{ filter: "[N] -> { S1[i] }" } ] } }')
    ctx = isl.Context()
    tree = isl.Schedule.read_from_str(ctx, text)
    block = format_schedule(tree)
    assert block.count("leaf") == 1 and block.rstrip().endswith('- filter: "[N] -> { S1[i] }"')
    assert isl.Schedule.read_from_str(ctx, block).plain_is_equal(tree)


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="unknown schedule style"):
        format_schedule(CHILDLESS_MARK.replace('" }', '", child: { leaf } }'), style="yaml")
