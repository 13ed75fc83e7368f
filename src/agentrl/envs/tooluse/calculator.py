"""A calculator that evaluates arithmetic by walking the AST: no `eval`, bounded work.

Allowed: numbers, + - * / // % ** (and ^ as power), parentheses, unary signs, the constants
pi and e, and a few math functions. Anything else (names, attributes, subscripts, lambdas)
is rejected with a message. Exponents and factorials are capped so `9**9**9` is an error,
not a frozen process.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agentrl.core import pyparse

MAX_EXPONENT = 1000
MAX_FACTORIAL = 500
MAX_INT_DIGITS = 400
MAX_EXPRESSION_CHARS = 500


class CalculatorError(ValueError):
    """The expression is not plain arithmetic or its value is out of range."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _factorial(x: Any) -> int:
    if not float(x).is_integer() or x < 0 or x > MAX_FACTORIAL:
        raise CalculatorError(f"factorial needs an integer in 0..{MAX_FACTORIAL}")
    return math.factorial(int(x))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": _factorial,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or CalculatorError saying what is not allowed."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = pyparse.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not a valid expression: {exc.msg}") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, ValueError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"math error: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("the result is not a number")
    return value


def format_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and abs(result) >= 10**MAX_INT_DIGITS:
            raise CalculatorError(f"result has more than {MAX_INT_DIGITS} digits")
        if isinstance(result, complex):
            raise CalculatorError("the result is not a real number")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None or node.keywords:
            raise CalculatorError(
                f"unknown function {node.func.id!r}; allowed: {', '.join(sorted(_FUNCTIONS))}"
            )
        if len(node.args) > 50:
            raise CalculatorError("too many arguments")
        return fn(*(_eval(a) for a in node.args))
    raise CalculatorError(f"{type(node).__name__} is not allowed in a calculator expression")


def _check_power(base: Any, exponent: Any) -> None:
    if abs(exponent) > MAX_EXPONENT and abs(base) not in (0, 1):
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
