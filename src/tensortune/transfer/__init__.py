"""Transfer-tuning: schedules tuned for some kernels, reused on kernels of the same class.

``classes`` says which kernels may share schedules, ``sources`` gathers the best schedules of
records stores by class, ``apply`` replays one on a new kernel (tiles re-fitted to its extents),
and ``run`` times the candidates, records them with their origin and builds the model
(``tensortune.transfer``); ``tune(warm_start=...)`` starts its search from them.
"""
