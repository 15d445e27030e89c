"""tensortune: fast auto-tuning of tensor programs on Apache TVM MetaSchedule."""
