"""Kernels of our own that do the stock's arithmetic in fewer launches, bit for bit (:mod:`.norm_rope`), and
where they run (:mod:`.exact`: inside captured graphs, on devices whose start-up check proved them)."""
