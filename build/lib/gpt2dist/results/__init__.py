"""Results: tidy tables and statistics from run records, figures and the report (`collect`, `plot`, `report`).
May import training (FLOP counts), system, data, pipeline and the shared ground; never launch."""
