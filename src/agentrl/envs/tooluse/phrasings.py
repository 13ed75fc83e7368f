"""How the tool-use questions are worded: two disjoint pools of templates.

`TRAIN` holds every wording the training generator uses (several per question kind: plain
and word problems, tables as CSV, markdown or prose, columns in any order, the question
before or after the table); `UNSEEN` holds wordings, table layouts and question kinds the
training generator never produces. The held-out "unseen pool" draws from `UNSEEN` only, so
a model that learned the training templates rather than the tools fails it (issue 52: the
warm start solved 25 of 30 of the generator's own held-out tasks and 3 of 90 unseen ones).

Every template is a `str.format` string; its id is `pool/name`. `tests/envs` checks that the
pools are disjoint by construction and by sampling (no training question matches an unseen
template, and no unseen question matches a training one).
"""

from __future__ import annotations

import re
import string
from typing import Any

# ---- arithmetic ------------------------------------------------------------------------
# Shapes (the kind of an arithmetic task): the expression's structure, a..d its numbers.
ARITHMETIC_SHAPES = ("sub_mul_add", "mul_sub_mul", "add_mul_sub", "mul_mul_sub")

TRAIN_ARITHMETIC_PLAIN = {
    "what_is": "What is {expr}? Give the exact integer.",
    "compute": "Compute {expr}.",
    "calculate": "Calculate {expr} and give the exact integer result.",
    "evaluate": "Evaluate the expression {expr}.",
    "equals": "{expr} = ?",
    "work_out": "Please work out {expr} exactly.",
}
TRAIN_ARITHMETIC_WORD = {
    "sub_mul_add": "A warehouse had {a} crates and sent out {b} of them. Each crate left holds "
    "{c} bottles, and {d} more bottles stand on a shelf. How many bottles are there in all?",
    "mul_sub_mul": "A farm packs {a} boxes of {b} eggs, and a shop sends back {c} boxes of {d} "
    "eggs. How many eggs does the farm keep, packed minus sent back?",
    "add_mul_sub": "A club has {a} adult and {b} junior members. Each member pays a fee of {c} "
    "minus a discount of {d}. How much do all members pay together?",
    "mul_mul_sub": "A printer prints {a} pages a minute for {b} minutes on each of {m} days, "
    "and {d} pages are spoiled. How many good pages does it print?",
}
UNSEEN_ARITHMETIC_WORDS = {  # the same shapes, said in words: no expression to copy
    "sub_mul_add": "Take {b} away from {a}, multiply what is left by {c}, then add {d}. "
    "Which number do you end up with?",
    "mul_sub_mul": "Subtract the product of {c} and {d} from the product of {a} and {b}. "
    "Tell me the resulting number.",
    "add_mul_sub": "Find the sum of {a} and {b}, and the difference of {c} minus {d}; "
    "then multiply those two results. What do you get?",
    "mul_mul_sub": "Multiply {a} by {b}, multiply that by {m}, and finally subtract {d}. "
    "Report the result.",
}
# shapes of arithmetic the training generator never asks
UNSEEN_ARITHMETIC_KINDS = {
    "timesheet_pay": "Timesheet for {who}: {days}. The pay rate is {rate} per hour. "
    "How much does {who} earn for these days? Round to 2 decimals.",
    "percent_change": "A bicycle is priced at {price}. The price goes up by {up} percent, and "
    "later the new price is cut by {down} percent. What does the bicycle cost now? "
    "Round to 2 decimals.",
    "distance_units": "A runner does {laps} laps of a {track} metre track and then runs "
    "{km} km on the road. How far does she run altogether, in metres?",
    "average_scores": "These are the scores of a quiz team: {scores}. "
    "Work out the team's average score, rounded to 2 decimals.",
}

# ---- data tables -----------------------------------------------------------------------
STOCK_COLUMNS = ("item", "price", "quantity")
CITY_COLUMNS = ("city", "temperature_c", "rainfall_mm")
SHIFT_COLUMNS = ("worker", "hours", "rate")

TRAIN_DATA_QUESTIONS: dict[str, tuple[str, ...]] = {
    "total_value": (
        "What is the total value (sum of price * quantity) of the stock? Round to 2 decimals.",
        "Find the total stock value: add price times quantity over all items. "
        "Give it to 2 decimals.",
        "How much is the whole stock worth (each item's price multiplied by its quantity, "
        "summed)? Round to 2 decimals.",
    ),
    "largest_value": (
        "Which item has the largest stock value (price * quantity)? Answer with its name.",
        "Name the item whose price times quantity is the highest.",
        "Of all items, which one is worth the most in stock (price x quantity)? Give the name.",
    ),
    "count_qty_gt": (
        "How many items have a quantity greater than {threshold}?",
        "Count the items with more than {threshold} units in stock.",
        "For how many items is the quantity above {threshold}?",
    ),
    "mean_temp": (
        "What is the mean temperature_c over all cities? Round to 2 decimals.",
        "Compute the average temperature of the cities listed, to 2 decimals.",
        "Give the mean of the temperature column across every city (2 decimals).",
    ),
    "coldest": (
        "Which city is the coldest? Answer with its name.",
        "Name the city with the lowest temperature.",
        "Which of the cities has the minimum temperature_c? Give the city.",
    ),
    "median_rain": (
        "What is the median rainfall_mm?",
        "Find the median of the rainfall figures.",
        "What is the middle value (median) of rainfall_mm over the cities?",
    ),
}
UNSEEN_DATA_QUESTIONS: dict[str, tuple[str, ...]] = {
    "total_value": (
        "If every unit on these shelves were sold at its listed price, what "
        "would the takings come to? Answer to 2 decimals.",
    ),
    "largest_value": (
        "Which product ties up the most money on the shelves? Reply with the product only.",
    ),
    "count_qty_gt": (
        "Our restock rule flags products holding over {threshold} units. "
        "How many products does the rule flag?",
    ),
    "mean_temp": (
        "Across the places in this weather log, what was the typical (arithmetic "
        "mean) temperature? Answer to 2 decimals.",
    ),
    "coldest": (
        "Where was it chilliest according to this weather log? Reply with the place only.",
    ),
    "median_rain": (
        "Sort the places by rain and report the rain figure of the one in "
        "the middle (the median; average the two middle ones if needed).",
    ),
    # kinds the training generator never asks
    "smallest_quantity": (
        "Which product is running lowest, i.e. has the fewest units "
        "left? Reply with the product only.",
    ),
    "price_range": (
        "By how much does the dearest product's unit price exceed the "
        "cheapest one's? Answer to 2 decimals.",
    ),
    "rain_above": (
        "Add up the rain of every place that was warmer than {threshold} "
        "degrees. What total do you get?",
    ),
    "timesheet_total": (
        "Using this week's timesheet, what is the total wage bill "
        "(hours times hourly rate, summed over everyone)? Answer to 2 "
        "decimals.",
    ),
}
DATA_KINDS_OF = {  # the table each kind reads
    "total_value": "stock",
    "largest_value": "stock",
    "count_qty_gt": "stock",
    "smallest_quantity": "stock",
    "price_range": "stock",
    "mean_temp": "city",
    "coldest": "city",
    "median_rain": "city",
    "rain_above": "city",
    "timesheet_total": "shift",
}
TRAIN_DATA_KINDS = tuple(TRAIN_DATA_QUESTIONS)
UNSEEN_DATA_KINDS = ("smallest_quantity", "price_range", "rain_above", "timesheet_total")

# Tables: layouts (csv, markdown: the columns in any order) and prose rows.
TRAIN_PROSE_ROWS = {
    "stock": "{item} costs {price} and {quantity} are in stock.",
    "city": "{city} had a temperature of {temperature_c} C and {rainfall_mm} mm of rain.",
}
UNSEEN_RECORD_ROWS = {  # key=value records and a chatty log: layouts training never shows
    "stock": "product={item}; unit price={price}; on hand={quantity}",
    "city": "place={city}; reading={temperature_c} degrees; rain gauge={rainfall_mm} mm",
    "shift": "worker={worker}; hours logged={hours}; hourly rate={rate}",
}
UNSEEN_LOG_ROWS = {
    "stock": "- we still have {quantity} of the {item}, at {price} apiece",
    "city": "- over in {city} it read {temperature_c} degrees, with {rainfall_mm} mm in the gauge",
    "shift": "- {worker} clocked {hours} hours, paid {rate} for each hour worked",
}
TRAIN_TABLE_INTROS = ("", "Data:", "The table:")

# ---- numbers ---------------------------------------------------------------------------
TRAIN_NUMBERS: dict[str, tuple[str, ...]] = {
    "sum_primes": (
        "What is the sum of all prime numbers below {n}?",
        "Add up every prime number smaller than {n}. What is the total?",
        "Find the total of the primes p with p < {n}.",
    ),
    "count_divisible": (
        "How many integers from 1 to {n} (inclusive) are divisible by {a} or by {b}?",
        "Count the whole numbers k with 1 <= k <= {n} that are multiples of {a} or of {b}.",
        "Among 1, 2, ..., {n}, how many numbers are divisible by {a}, by {b}, or by both?",
    ),
    "fibonacci": (
        "What is Fibonacci number F({n}), with F(1) = F(2) = 1?",
        "With F(1) = F(2) = 1 and F(k) = F(k-1) + F(k-2), give F({n}).",
        "Compute the {n}th Fibonacci number (the sequence starts 1, 1, 2, 3, 5).",
    ),
    "digit_sum_pow2": (
        "What is the sum of the decimal digits of 2**{k}?",
        "Add the digits of 2 to the power {k} (written in base 10).",
        "Take 2^{k} in decimal and sum its digits. What is the sum?",
    ),
}
UNSEEN_NUMBERS: dict[str, tuple[str, ...]] = {
    "sum_primes": (
        "I'm listing primes starting at 2 and stopping before I reach {n}. If "
        "I add them all, what number comes out?",
    ),
    "count_divisible": (
        "Tickets are numbered 1 up to {n}. A ticket wins if its number "
        "splits evenly by {a} or by {b}. How many tickets win?",
    ),
    "fibonacci": (
        "Rabbit pairs: 1 pair in month one, 1 in month two, and every month after "
        "holds as many pairs as the two months before it combined. How many pairs "
        "in month {n}?",
    ),
    "digit_sum_pow2": (
        "Double the number 1 exactly {k} times in a row. What do the digits "
        "of the result add up to?",
    ),
    # kinds the training generator never asks
    "count_primes": ("How many primes are there that are smaller than {n}? Give the count.",),
    "sum_squares": (
        "Square each whole number from 1 up to {n} and total the squares. What is the total?",
    ),
    "divisor_count": ("How many positive whole numbers divide {n} without a remainder?",),
    "collatz_steps": (
        "Start from {n}. If the number is even halve it, otherwise triple it "
        "and add one. How many such steps until you reach 1?",
    ),
}
TRAIN_NUMBER_KINDS = tuple(TRAIN_NUMBERS)
UNSEEN_NUMBER_KINDS = ("count_primes", "sum_squares", "divisor_count", "collatz_steps")

NAMES = ("Dana", "Ravi", "Mei", "Tomas", "Aiko", "Lena", "Omar", "Ines")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")


def templates(pool: str) -> dict[str, str]:
    """Every template of `pool` ("train" or "unseen") by id `pool/name`: the question
    sentences and the table rows, the parts a template matcher could learn."""
    if pool == "train":
        parts: dict[str, Any] = {
            "arithmetic/plain": TRAIN_ARITHMETIC_PLAIN,
            "arithmetic/word": TRAIN_ARITHMETIC_WORD,
            "data/q": TRAIN_DATA_QUESTIONS,
            "data/row": TRAIN_PROSE_ROWS,
            "numbers/q": TRAIN_NUMBERS,
        }
    elif pool == "unseen":
        parts = {
            "arithmetic/words": UNSEEN_ARITHMETIC_WORDS,
            "arithmetic/kind": UNSEEN_ARITHMETIC_KINDS,
            "data/q": UNSEEN_DATA_QUESTIONS,
            "data/record": UNSEEN_RECORD_ROWS,
            "data/log": UNSEEN_LOG_ROWS,
            "numbers/q": UNSEEN_NUMBERS,
        }
    else:
        raise ValueError(f"pool {pool!r}: use 'train' or 'unseen'")
    out: dict[str, str] = {}
    for group, table in parts.items():
        for name, value in table.items():
            values = value if isinstance(value, tuple) else (value,)
            for i, text in enumerate(values):
                out[f"{pool}/{group}/{name}/{i}"] = text
    return out


def template_regex(text: str) -> re.Pattern[str]:
    """A matcher of one template: its fixed words literally, each field as any text."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(text):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(r".+?")
    return re.compile("".join(parts), re.DOTALL)


def longest_literal(text: str) -> str:
    """The template's longest fixed stretch of words (what a sample of it must contain)."""
    return max((lit for lit, *_ in string.Formatter().parse(text)), key=len)
