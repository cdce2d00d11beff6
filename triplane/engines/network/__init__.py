"""Network engines move frames between nodes: udp and tcp behind one small protocol
(:mod:`.base`), the probe that measures a pair of nodes (:mod:`.measure`), wrappers that
delay or lose frames (:mod:`.wrappers`) and the conformance kit (:mod:`.testing`)."""
