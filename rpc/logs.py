"""Where what a peer can make us log per connection goes: its protocol violations, one
WARNING line each, the work a graceful close cut, and the failures of ``on_open`` (a
server's ``on_connect``) that closed its connection, with their tracebacks; each at most 20
records per 10 s (:class:`~transports.logs.RateLimitedLog`, shared with the transports)."""

from __future__ import annotations

import logging

from transports.logs import RateLimitedLog

violations = RateLimitedLog(logging.getLogger("peerwire.rpc.violations"))
"""Where peers' protocol violations are reported."""
cuts = RateLimitedLog(logging.getLogger("peerwire.rpc"))
"""Where a graceful close reports the work it cut, still running when its drain ended (a
server closing thousands of connections at once logs at most 20 such lines per 10 s)."""
refusals = RateLimitedLog(logging.getLogger("peerwire.rpc"))
"""Where an ``on_open`` callback's failure that closed the connection is reported (a
server refusing clients in ``on_connect`` would otherwise log a traceback each)."""
