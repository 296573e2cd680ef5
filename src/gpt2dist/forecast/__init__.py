"""Forecasts, before anything runs: the GPU step model and the published measurements it is fitted to and judged
on, the programs behind them, the CPU step model of a study's runs, the link model across nodes, plan, recommend
and their words. Torch-free; it reads the registry, the memory and traffic models (config) and the hardware facts
(system), never the study's results."""
