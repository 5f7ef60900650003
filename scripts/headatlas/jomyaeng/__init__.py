"""Jo & Myaeng 2020, Roles and Utilization of Attention Heads: probing tasks, per-head probes, top-n heads."""
