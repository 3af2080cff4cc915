"""Where peers' protocol violations are logged: one WARNING line per violation, at most 20
per 10 s (:class:`~transports.logs.RateLimitedLog`, shared with the transports)."""

from __future__ import annotations

import logging

from transports.logs import RateLimitedLog

violations = RateLimitedLog(logging.getLogger("peerwire.rpc.violations"))
"""Where peers' protocol violations are reported."""
