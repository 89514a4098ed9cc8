from __future__ import annotations

from supplier_agent.cli import main

raise SystemExit(main())
