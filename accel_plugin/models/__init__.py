"""Real models: fetching them (``accel models get``) and checking model directories."""
