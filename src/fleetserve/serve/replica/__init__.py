"""A model replica: the Serve deployment that owns one engine, and the stream relay that
carries every stream of a replica back to each ingress over one connection."""
