"""The API's one request parser: JSON within bounds that hold before parsing work grows.

A body over ``API_MAX_BODY_BYTES`` is refused by ``hub.api.middleware`` before it is read; here a
nesting deeper than ``MAX_JSON_DEPTH`` is refused (Python's decoder raised RecursionError past
~1,000 levels, which answered an HTML 500, and shallower nests still reached recursive code).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# The deepest a real request goes is an object of lists of objects; 32 leaves room.
MAX_JSON_DEPTH = 32


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` containers (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        too_deep = ParseError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise too_deep from None
        if json_depth_exceeds(data, MAX_JSON_DEPTH):
            raise too_deep
        return data
