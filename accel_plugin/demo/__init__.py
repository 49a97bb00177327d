"""`accel demo`, framework-neutral parts: demo model families (:mod:`.family`) and
the report of a side-by-side run (:mod:`.report`). The engines themselves run in
the vLLM adapter (``accel_plugin.adapters.vllm.demo``)."""
