"""Canonical forms of final answers: the keys maj@k votes on and distinct-correct counts.

Two samples that give the same answer in different spellings ("3+5" and "3 + 5", "132" and "132.0")
must vote together and count as one distinct answer. Each task maps its extracted answer to a key
(``Task.canonical_answer``); these are the pure functions behind those maps.

Design decisions:

- A key is a string, so ``eval.json`` records it (``votes``) beside the raw answer (``answers``);
  None stays None (no answer, no vote).
- Text: whitespace runs collapsed to one space, ends stripped (the default of every task).
- Numbers: the exact rational value (``fractions.Fraction``, thousands commas dropped): ``"132"``,
  ``"132.0"`` and ``"1,32"`` are all ``"132"``; a non-integer is written as an exact decimal when it
  terminates (``"0.5"``), else as ``p/q``. Text that is not a number keeps its text key.
- Equations (countdown): a normal form that is blind to spacing, redundant parentheses, the order of
  the operands of ``+`` and ``*`` and the grouping of chains of ``+``/``-`` and of ``*``/``/`` (signs
  and divisions are distributed: ``a - (b - c)`` is ``a - b + c``, ``a / (b / c)`` is ``a * c / b``;
  unary plus is dropped, unary minus moves out of products into the enclosing sum). It is not blind
  to distributivity: ``a * (b + c)`` and ``a * b + a * c`` are different ways to reach a target.
  ``**`` and ``//`` keep their structure with canonical operands. The equation is parsed with
  ``ast`` (never evaluated); what does not parse as arithmetic keeps its text key.
- Programs (code tasks): ``ast.unparse(ast.parse(code))``, blind to formatting, comments and
  redundant parentheses; code that does not parse keeps its text key. Two programs that behave
  alike but read differently still count as two.
"""

from __future__ import annotations

import ast
from fractions import Fraction

_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Pow, ast.USub, ast.UAdd)


def canonical_text(text: str | None) -> str | None:
    """``text`` with whitespace runs collapsed and the ends stripped."""
    return None if text is None else " ".join(str(text).split())


# -- numbers -----------------------------------------------------------------------------------------


def _decimal(value: Fraction) -> str | None:
    """``value`` as an exact decimal string when its expansion terminates, else None."""
    q, twos, fives = value.denominator, 0, 0
    while q % 2 == 0:
        q, twos = q // 2, twos + 1
    while q % 5 == 0:
        q, fives = q // 5, fives + 1
    if q != 1:
        return None
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10 ** places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    text = f"{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".") if places else digits
    return f"-{text}" if value < 0 else text


def canonical_number(text: str | None) -> str | None:
    """The exact value of a numeric answer as a key (``"1,200.00"`` -> ``"1200"``); other text keeps its text key."""
    if text is None:
        return None
    try:
        value = Fraction(str(text).replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return canonical_text(text)
    if value.denominator == 1:
        return str(value.numerator)
    return _decimal(value) or f"{value.numerator}/{value.denominator}"


# -- equations ---------------------------------------------------------------------------------------


def is_arithmetic(tree: ast.AST) -> bool:
    """Whether ``tree`` holds only numeric literals and unary/binary arithmetic."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                return False
        elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.expr_context) + _ARITHMETIC):
            return False
    return True


def _terms(node: ast.expr, sign: int, out: list) -> None:
    """Flatten a chain of + and - (and unary signs) into signed terms."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        _terms(node.left, sign, out)
        _terms(node.right, sign if isinstance(node.op, ast.Add) else -sign, out)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _terms(node.operand, -sign if isinstance(node.op, ast.USub) else sign, out)
    else:
        out.append((sign, node))


def _factors(node: ast.expr, power: int, out: list) -> int:
    """Flatten a chain of * and / into factors with power +1 (numerator) or -1; returns the sign pulled out."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        left = _factors(node.left, power, out)
        return left * _factors(node.right, power if isinstance(node.op, ast.Mult) else -power, out)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return (-1 if isinstance(node.op, ast.USub) else 1) * _factors(node.operand, power, out)
    out.append((power, node))
    return 1


def _literal(value: int | float) -> str:
    return str(value) if type(value) is int else repr(value)


def _operand(node: ast.expr) -> str:
    text = _sum(node)
    return text if isinstance(node, ast.Constant) else f"({text})"


def _factor(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return _literal(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return f"({_sum(node)})"
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.FloorDiv)):
        return f"{_operand(node.left)} {'**' if isinstance(node.op, ast.Pow) else '//'} {_operand(node.right)}"
    return ast.unparse(node)


def _product(node: ast.expr) -> tuple[int, str]:
    factors: list = []
    sign = _factors(node, 1, factors)
    parts = sorted(((power, _factor(f)) for power, f in factors), key=lambda p: (p[0] < 0, p[1]))
    text = parts[0][1]  # the leftmost factor of a chain is always a numerator
    for power, part in parts[1:]:
        text += (" * " if power > 0 else " / ") + part
    return sign, text


def _sum(node: ast.expr) -> str:
    terms: list = []
    _terms(node, 1, terms)
    items = []
    for sign, term in terms:
        inner, text = _product(term)
        items.append((sign * inner, text))
    items.sort(key=lambda item: (item[0] < 0, item[1]))
    out = ""
    for i, (sign, text) in enumerate(items):
        out += (("" if sign > 0 else "-") if i == 0 else (" + " if sign > 0 else " - ")) + text
    return out


def canonical_expression(tree: ast.expr) -> str:
    """The normal form of an arithmetic expression tree (see the module docstring)."""
    return _sum(tree)


def canonical_equation(text: str | None) -> str | None:
    """The key of a countdown equation: its normal form when it parses as arithmetic, else its text key."""
    if text is None:
        return None
    try:
        tree = ast.parse(str(text).strip(), mode="eval").body
        if is_arithmetic(tree):
            return canonical_expression(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    return canonical_text(text)


# -- programs ----------------------------------------------------------------------------------------


def canonical_program(code: str | None) -> str | None:
    """``ast.unparse(ast.parse(code))`` when the code parses, else its text key."""
    if code is None:
        return None
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return canonical_text(code)
