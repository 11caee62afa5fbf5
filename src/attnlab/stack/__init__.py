"""The one stack every model runs on: norms and MLPs, the Transformer and its forward, sampling, hooks."""
