"""smolagents tools used by the integration tests: one @tool function and one Tool subclass."""

from __future__ import annotations

from typing import Any

import smolagents
from smolagents import tool

CALLS: list[tuple[str, dict[str, Any]]] = []


@tool  # smolagents warns about any other spelling of its decorator
def get_weather(city: str, units: str | None = None) -> str:
    """Tell the weather in a city.

    Args:
        city: The city's name.
        units: 'metric' or 'imperial'.
    """
    CALLS.append(("get_weather", {"city": city, "units": units}))
    return f"sunny in {city}"


class Summer(smolagents.Tool):
    """A Tool subclass with every input type smolagents names."""

    name = "summer"
    description = "Add numbers up, with options."
    inputs = {  # noqa: RUF012 - smolagents declares inputs as a class attribute
        "a": {"type": "integer", "description": "The first number."},
        "xs": {"type": "array", "description": "More numbers."},
        "scale": {"type": "number", "description": "A factor.", "nullable": True},
        "negate": {"type": "boolean", "description": "Negate the sum.", "nullable": True},
        "meta": {"type": "object", "description": "Anything.", "nullable": True},
        "label": {"type": "string", "description": "A label.", "nullable": True},
    }
    output_type = "number"

    def __init__(self) -> None:
        super().__init__()
        self.setups = 0

    def setup(self) -> None:
        self.setups += 1
        self.is_initialized = True

    def forward(self, a: int, xs: list[Any], scale: float | None = 1.0, negate: bool | None = False,
                meta: dict[str, Any] | None = None, label: str | None = None) -> float:
        CALLS.append(("summer", {"a": a, "xs": xs}))
        total = (a + sum(xs)) * (scale if scale is not None else 1.0)
        return -total if negate else total
