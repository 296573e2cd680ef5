"""The study's results: the runs read into tidy tables, summarised with intervals, their traces, the ranking in
tiers, the papers' claims judged, figures, the report and the bundle (`collect`, `plot`, `report`, `bundle`).
Forecasts it sets beside the measurements come from gpt2dist.forecast."""
