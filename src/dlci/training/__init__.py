"""What every gate shares about training the user's code: the Target and its loading,
batching, the step, the user-code guard, and the framework adapters (Lightning,
Transformers). The memorization gate, the doctor and the profiler all train through here."""
