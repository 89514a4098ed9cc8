"""CloudGPU supplier agent: plain asyncio Python that never imports Django."""

from __future__ import annotations

__version__ = "0.3.0"
