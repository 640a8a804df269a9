"""Capture traces, load them into pandas, link ops to modules, rank hotspots against the roofline."""
