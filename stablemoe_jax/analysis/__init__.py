"""Routing analysis: records of the routing during training, fluctuation (the paper's Figures 2 and 8),
cohesion (Table 7) and load statistics. See docs/evaluation.md, "Routing analysis"."""
