"""`accel demo`, framework-neutral parts: demo model families (:mod:`.family`), the
settings and plan of a side-by-side run (:mod:`.plan`) and its report
(:mod:`.report`). The engines themselves run in the vLLM adapter
(``accel_plugin.adapters.vllm.demo``)."""
