"""A snapshot's allocator trace, decoded for replay: the codes (:mod:`.codes`), the decoded
:class:`~.model.Trace`, the one-pass decoder (:mod:`.decode`), the snapshot reader that picks
the device, start state and pools (:mod:`.extract`), a recorded cell's start (:mod:`.cells`) and
fast row searches (:mod:`.rows`)."""
