"""Names vulture (the dead-code check in .ci/run) may not call dead, each with the reason.

vulture reads the package alone, so a name used only by tests counts as dead: that is the
point (code kept only for its tests is deleted, not listed here). What is listed is used by
someone vulture cannot see: a format we mirror, a framework that calls or reads it, or a
test that observes it through a public counter. A new entry needs a reason in its group.
"""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# ---- Called or read by Python, IPython, ipywidgets, plotly, pickle or shlex by name.
_.__getattr__  # allocconf_widget/__init__.py: PEP 562 lazy attributes
_.__loader__  # adapters/flight_history.py: a module object's import metadata
_.find_class  # core/memory/snapshot.py: pickle.Unpickler's hook (refuses every class)
_._ipython_display_  # views/widgets: IPython's display protocol
_.whitespace_split  # views/magic/completion.py: shlex settings
_.commenters
_.matcher_api_version  # views/magic/completion.py: IPython's matcher API v2 attributes
_.matcher_identifier
_.readout  # views/widgets: ipywidgets traits set by assignment (synced to the page)
_.placeholder
_.tooltip
_.button_style
_.selected_index
_.outputs
_.hovertemplate  # views/charts/figures.py: plotly trace/layout properties set by assignment
_.annotations

# ---- Fields of formats we read or write: they document the format and are kept whole.
# memory snapshots (core/memory/snapshot.py TypedDicts mirror torch's own)
_.fx_node_op
_.fx_node_name
_.fx_original_trace
_.fx_node_info
_.real_size
_.cpp_frames
_.allocated_size
_.active_size
_.segment_type
_.segment_pool_id
_.compile_context
_.user_metadata
_.device_traces
_.external_annotations
_.host_segments
_.host_traces
# recording sidecars (core/memory/recording.py; written by benchmarks/gpu/record.py)
_.workload
_.device_name
_.wall_s
_.oom_message
_.trace_events
# the settings file (adapters/persist.py) and torch's OOM message (core/memory/oom.py)
_.saved_at
_.private_pools
_.message_format

# ---- Results read by tests and benchmarks as the public figures of a run, not test hooks:
# counters a caller may show, and the simulator's bookkeeping docs/simulator.md describes.
_.rounds  # adapters/sampler.py, adapters/replay.py: overhead counters
_.listener_errors
_.write_errors  # adapters/rank_channel.py
_.skipped  # views/widgets/monitor.py: frames dropped by the redraw throttle
_.stored_points  # core/memory/timeline.py: the memory bound the benchmark reports
_.registered  # adapters/step_hook.py: whether torch's hook is installed (status)
_.clear_capture  # adapters/flight_history.py: frees tens of MiB (tests call it between runs)
_.changes_settings  # core/memory/oom.py: whether an advice edits the configuration
_.fraction_devices  # adapters/apply.py: which devices a fraction was set on
_.largest_free_block  # adapters/probe.py: a reading of the live allocator
_.seconds_since_report  # app/ranks.py: a rank's age, for "silent"
_.oom_at_bytes  # app/dryrun.py Prediction: a field of run.predict()'s public result
_.num_ops  # core/sim/trace/model.py and result.py: replay bookkeeping (docs/simulator.md)
_.first_unknown_free
_.ambiguous_releases
_.limit_changes
_.rounded_bytes
_.recorded_event_index
_.simulated_event_index
_.derived_sizes  # core/sim/state.py
_.private_segments  # core/sim/pools.py
_.same_as  # core/sim/state.py: state comparison for verification (fidelity, start-state tests)
_.python_engine  # core/sim/native.py: tests and benchmarks replay on the Python engine inside it
_.used_native  # core/sim/native.NativeEngine: tests and benchmarks ask whether the compiled engine served
_.differences

# ---- read by IPython's display machinery and ipywidgets' traits (set by assignment)
_._repr_html_  # views/text/simulate.SimulationDisplay: IPython calls it to show the HTML table
_.flex  # ipywidgets Layout traits (views/widgets/confirm.natural_width: buttons at their text's width)
_.min_width
_.align_self
_.cuda_was_initialized  # adapters/dryrun.DryRunTrace: part of the trace's record (also noted in its notes)

# ---- The dry run's stand-ins for torch.cuda's Stream and Event (adapters/dryrun/entry_points.py):
# torch's own API, called by the user's step, never by the package.
_.cuda_stream
_.stream_id
_.device_index
_.device_type
_.wait_event
_.wait_stream
_.record_event
_.is_capturing
_.elapsed_time
_.ipc_handle
_.synchronize

# ---- Read by tqdm (views/text/progress.py): 0 starts no monitor thread.
_.monitor_interval

# ---- Python's protocol for a metaclass (adapters/dryrun/entry_points._ClassStandIn): called by
# ``X()``, ``isinstance`` and ``issubclass``, never by name.
_.__call__
_.__instancecheck__
_.__subclasscheck__
