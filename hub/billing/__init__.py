"""Money: an append-only ledger in integer micro-units, lease metering, fees, top-ups."""
