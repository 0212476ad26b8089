"""A scenario family is one folder: outside gtep/protocol/families/<name>/, its flow (gtep/engine/flows/) and its
learners (gtep/algorithms/<name>/), no code of gtep names a family (an identifier, an import or a string that is not
a docstring); presets and docs may. So a new family touches nothing in config, orchestration or report."""
import ast
import re
from pathlib import Path

import gtep
from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES

ROOT = Path(gtep.__file__).parent
OWN_FOLDERS = ("protocol/families/", "engine/flows/", "presets/",
               *(f"algorithms/{name}/" for name in FAMILIES if name != CLASS_INCREMENTAL))


def family_pattern() -> re.Pattern:
    names = "|".join(sorted(name for name in FAMILIES if name != CLASS_INCREMENTAL))
    return re.compile(rf"(?<![a-z])({names})(?![a-z])", re.IGNORECASE)


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def code_texts(tree: ast.AST):
    """(line, text) of every identifier, imported name and non-docstring string of a module."""
    skip = docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, ast.alias):
            yield line, node.asname or node.name
        elif isinstance(node, ast.ImportFrom):
            yield line, node.module or ""
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield line, node.value


def test_no_family_is_named_outside_its_folders():
    pattern = family_pattern()
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(OWN_FOLDERS):
            continue
        for line, text in code_texts(ast.parse(path.read_text())):
            if pattern.search(text):
                found.append(f"{relative}:{line}: {text[:80]!r}")
    assert not found, "family names outside their folders:\n" + "\n".join(found)


def test_the_check_sees_a_family_name_where_one_is_written(tmp_path):
    """The scan itself: a string naming a family is found, a docstring or comment naming one is not."""
    module = 'def f():\n    """fscil in a docstring"""\n    return "fscil"  # iirc in a comment\n'
    texts = [text for _, text in code_texts(ast.parse(module))]
    assert [t for t in texts if family_pattern().search(t)] == ["fscil"]
