"""The verifier's check registry (assay.verify.checks) is the one list of check names: every
check the harness can record is registered and nothing else is, the archive's card describes
each from it, and the README's table says exactly what the registry says. No torch."""

from __future__ import annotations

import ast
import re

import pytest

from assay.archive.export import check_description
from assay.records import Verdict
from assay.verify import checks
from helpers import REPO

HARNESS = REPO / "src" / "assay" / "verify" / "harness.py"


def _names_of(expr: ast.expr, assigned: dict[str, list[ast.expr]]) -> set[str]:
    """The string values ``expr`` can take: constants, either branch of ``a if c else b``, the
    values (not keys) of ``{...}.get(k, default)``, and what a local variable was assigned."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _names_of(expr.body, assigned) | _names_of(expr.orelse, assigned)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr == "get" and isinstance(expr.func.value, ast.Dict):
        out = set().union(*(_names_of(v, assigned) for v in expr.func.value.values))
        return out | set().union(*(_names_of(a, assigned) for a in expr.args[1:]))
    if isinstance(expr, ast.Name) and expr.id in assigned:
        return set().union(*(_names_of(v, assigned) for v in assigned[expr.id]))
    raise AssertionError(f"harness.py:{expr.lineno}: a check name the test cannot resolve "
                         f"({ast.unparse(expr)}): keep names literal or simple")


def harness_check_names() -> set[str]:
    """Every name harness.py can pass to ``checks.record`` (read from its source)."""
    names: set[str] = set()
    tree = ast.parse(HARNESS.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        assigned: dict[str, list[ast.expr]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "checks.record":
                names |= _names_of(node.args[1], assigned)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".check"):
                raise AssertionError(f"harness.py:{node.lineno}: records a check around the "
                                     f"registry ({ast.unparse(node.func)})")
    return names


def readme_check_table() -> dict[str, str]:
    """{check: rejects} from README.md's table under "What the verifier checks" (a row may name
    several checks)."""
    text = (REPO / "README.md").read_text()
    section = text.split("### What the verifier checks", 1)[1]
    rows = [line for line in section.split("\n\n| check | rejects |", 1)[1].split("\n\n")[0]
            .splitlines() if line.startswith("|")]
    assert rows[0].startswith("| --- |"), rows[0]
    table: dict[str, str] = {}
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ", 1)]
        names = re.findall(r"`(\w+)`", cells[0])
        assert names and re.fullmatch(r"(`\w+`(, )?)+", cells[0]), row
        for name in names:
            assert name not in table, f"README names {name} twice"
            table[name] = cells[1]
    return table


def test_the_harness_records_exactly_the_registered_checks():
    produced = harness_check_names()
    # The resolution reached the names chosen at run time, not only the literal ones.
    assert {"timeout", "crash", "compiles", "constructs", "runs", "lazy_output"} <= produced
    assert produced <= set(checks.REGISTRY), produced - set(checks.REGISTRY)
    assert set(checks.REGISTRY) <= produced, ("registered, never recorded",
                                              set(checks.REGISTRY) - produced)


def test_the_archive_describes_every_check_from_the_registry():
    for name, check in checks.REGISTRY.items():
        assert check_description(name) == check.rejects, name
    assert "not a check of this verifier version" in check_description("timing")


def test_the_readme_table_is_the_registry():
    table = readme_check_table()
    assert set(table) - set(checks.REGISTRY) == set(), "README names unknown checks"
    assert set(checks.REGISTRY) - set(table) == set(), "checks missing from the README"
    for name, rejects in table.items():
        assert rejects == checks.REGISTRY[name].rejects, name


def test_records_refuse_unknown_names_and_failed_informational_checks():
    v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    assert checks.record(v, "correctness", False, "off") is False
    assert v.reasons == ["correctness"] and v.checks["correctness"]["detail"] == "off"
    with pytest.raises(checks.CheckError, match="timing"):
        checks.record(v, "timing", True)
    with pytest.raises(checks.CheckError, match="informational"):
        checks.record(v, "sandbox", False, "")
    assert set(v.checks) == {"correctness"}
    # Not a KeyError or ValueError: the harness reads those as a malformed worker report.
    assert not issubclass(checks.CheckError, (KeyError, ValueError, TypeError, IndexError,
                                              AttributeError))


def test_registry_fields():
    for name, c in checks.REGISTRY.items():
        assert c.name == name and re.fullmatch(r"[a-z_]+", name)
        assert c.rejects and "|" not in c.rejects and "\n" not in c.rejects, name
        assert set(c.targets) <= set(checks.TARGETS) and c.targets, name
        assert set(c.policies) <= set(checks.POLICIES) and c.policies, name
    assert [n for n, c in checks.REGISTRY.items() if c.informational] == ["memory_plan", "sandbox"]


def test_the_zoos_expect_only_registered_checks():
    """Every reason a zoo case (cpu and cuda) expects or allows is a registered check."""
    for zoo in ("zoo", "zoo_cuda"):
        for path in sorted((REPO / "tests" / zoo / "candidates").glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name) \
                        and node.targets[0].id in ("EXPECT", "ALSO"):
                    names = set(ast.literal_eval(node.value))
                    assert names <= set(checks.REGISTRY), (path.name, names - set(checks.REGISTRY))
