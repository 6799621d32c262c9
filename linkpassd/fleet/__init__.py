"""What the programs share about the fleet, so none imports another for it:
who a certificate names (identity: the aggregator authorises by it, linkpassd
checks its own certificate by it) and what a hosts x rails grid cell shows
(grid: the aggregator's page and `linkpassctl fleet`). Pure: no sockets, no
servers.
"""
