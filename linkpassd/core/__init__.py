"""The pure core: decisions from samples, config and `now`. No I/O here."""
