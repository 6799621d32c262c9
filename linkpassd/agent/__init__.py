"""linkpassd's agent: the host's side of the aggregator stream (issue 12).

`spool` keeps unacknowledged events on disk, `client` holds the gRPC stream,
`reports` builds what the stream says about the host, and `link` is the
daemon's side (a mixin of `Daemon`). None of it can hold up the reconcile
loop: the daemon only ever hands over, never waits.
"""
