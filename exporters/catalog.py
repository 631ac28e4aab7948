"""Every metric the exporter publishes: name, type, labels, help and data, in one table.

The collector writes the families in this order, headers from this table and
samples from the snapshot attribute each entry names; the metrics reference in
the docs is generated from it, so the three cannot drift apart. Publishing one
more quantity of data a snapshot already has is one entry here (and, where the
quantity is new, one attribute on its section).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The exporter's own labels, on every series it writes: the serving engine (`sglang`,
#: `vllm`, or `reference` for the reference runtime) and the served model, as the engines
#: label their own metrics. One exporter observes one of each.
IDENTITY = ("engine", "model_name")
REQ = ("workload", "mode", "rank")
POS = ("workload", "mode", "rank", "position")
STEP = ("mode", "rank")
REL = ("workload", "mode", "position")
SRC = ("source",)
CTX = (*STEP, "context")
CONTEXT_BUCKET = (
    " Per context bucket: steps by their mean context tokens per request (SGLang prefix_len), "
    "`context` the bucket's lower bound (0, 64, 128, ... 131072; each up to the next, the last "
    "open); steps without request rows are left out."
)
POS_BIN = (*POS, "bin")
REL_BIN = (*REL, "bin")
NOT_AGGREGABLE = (
    " A per-process convenience: not aggregable across series (a mean of ratios is not the "
    "ratio of sums); fleet figures come from the counters (deploy/rules/fleet.yml)."
)

CALIBRATION_ROWS = (
    "Rows: request-steps whose prefix label is known at that position: all positions where the "
    "ceiling is known (static, cap-accept, shadow twin); in compact alone, accepted positions "
    "and every position from the first rejection on, never positions past a fully accepted "
    "window."
)
SLIDING = "over the last {window} steps (a ring of 8 blocks)"


@dataclass(frozen=True)
class Metric:
    """One family: its name, type, label names and help (`{window}`: the section's window
    in steps), and where its data is: `source = (section, attribute)` of a published
    snapshot (`dspark_obs.series`), a part or a tuple of parts."""

    name: str
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    source: tuple[str, str]
    #: fine detail, written only with `--detail-metrics`: outside the series budget, and
    #: read by no dashboard panel, recording rule or alert (docs/metrics.md)
    detail: bool = False


CATALOG: tuple[Metric, ...] = (
    # tokens per request-step
    Metric(
        "dspark_request_steps_total",
        "counter",
        REQ,
        "Request-steps seen: one request in one verify step.",
        source=("tokens", "request_steps"),
    ),
    Metric(
        "dspark_window_tokens",
        "histogram",
        REQ,
        "Drafts verified per request-step (SGLang verify_len - 1); integer buckets 0..gamma.",
        source=("tokens", "window_tokens"),
    ),
    Metric(
        "dspark_accepted_tokens",
        "histogram",
        REQ,
        "Drafts the target accepted per request-step (SGLang correct_drafts); buckets 0..gamma.",
        source=("tokens", "accepted_tokens"),
    ),
    Metric(
        "dspark_committed_tokens",
        "histogram",
        REQ,
        "Tokens committed per request-step (SGLang acc_len: accepted drafts plus the bonus); "
        "buckets 0..gamma+1.",
        source=("tokens", "committed_tokens"),
    ),
    Metric(
        "dspark_ceiling_tokens",
        "histogram",
        (*REQ, "source"),
        "Drafts full-block verification accepts per request-step, where known: "
        "source=observed from static and cap-accept rows, source=shadow from a cap-accept "
        "twin of a compact request; buckets 0..gamma.",
        source=("tokens", "ceiling_tokens"),
    ),
    Metric(
        "dspark_trimmed_draft_tokens_total",
        "counter",
        REQ,
        "Drafted tokens left unverified by trimming (gamma - window per request-step).",
        source=("tokens", "trimmed_draft_tokens"),
    ),
    Metric(
        "dspark_trim_loss_tokens_total",
        "counter",
        REQ,
        "Tokens full verification would have accepted beyond the window (ceiling - accepted), "
        "on request-steps whose ceiling is known.",
        source=("tokens", "trim_loss_tokens"),
    ),
    Metric(
        "dspark_utilisation_ratio",
        "gauge",
        REQ,
        "Accepted / ceiling " + SLIDING + ", over request-steps whose ceiling is known; "
        "1 means trimming lost nothing." + NOT_AGGREGABLE,
        source=("tokens", "utilisation"),
    ),
    Metric(
        "dspark_utilisation_cumulative_ratio",
        "gauge",
        REQ,
        "Accepted / ceiling since start, over request-steps whose ceiling is known."
        + NOT_AGGREGABLE,
        source=("tokens", "utilisation_cumulative"),
    ),
    Metric(
        "dspark_window_mean_tokens",
        "gauge",
        REQ,
        "Mean drafts verified " + SLIDING + ".",
        source=("tokens", "window_mean"),
    ),
    Metric(
        "dspark_accepted_mean_tokens",
        "gauge",
        REQ,
        "Mean drafts accepted " + SLIDING + ".",
        source=("tokens", "accepted_mean"),
    ),
    Metric(
        "dspark_ceiling_mean_tokens",
        "gauge",
        REQ,
        "Mean ceiling " + SLIDING + ", over request-steps whose ceiling is known." + NOT_AGGREGABLE,
        source=("tokens", "ceiling_mean"),
    ),
    # confidence calibration
    Metric(
        "dspark_confidence_labelled_total",
        "counter",
        POS,
        "Labelled request-step positions behind the calibration metrics. " + CALIBRATION_ROWS,
        source=("confidence", "labelled"),
    ),
    Metric(
        "dspark_confidence_ece",
        "gauge",
        POS,
        "Expected calibration error of survival at this position " + SLIDING + ": 15 "
        "equal-width bins on [0, 1], |mean predicted - observed| weighted by rows. "
        + CALIBRATION_ROWS
        + NOT_AGGREGABLE,
        source=("confidence", "ece"),
    ),
    Metric(
        "dspark_confidence_ece_cumulative",
        "gauge",
        POS,
        "Expected calibration error since start (15 equal-width bins). "
        + CALIBRATION_ROWS
        + NOT_AGGREGABLE,
        source=("confidence", "ece_cumulative"),
    ),
    Metric(
        "dspark_confidence_brier",
        "gauge",
        POS,
        "Brier score of survival " + SLIDING + ". " + CALIBRATION_ROWS + NOT_AGGREGABLE,
        source=("confidence", "brier"),
    ),
    Metric(
        "dspark_confidence_auroc",
        "gauge",
        POS,
        "AUROC of survival against the prefix label " + SLIDING + ", from a 1,020-bin "
        "histogram (68 bins to each of the 15 ECE bins; `dspark-obs calibration` uses 1,024 "
        "bins, as SGLang, and both are within one bin of the exact value). "
        + CALIBRATION_ROWS
        + NOT_AGGREGABLE,
        source=("confidence", "auroc"),
    ),
    Metric(
        "dspark_confidence_predicted_mean",
        "gauge",
        POS,
        "Mean predicted survival " + SLIDING + ". " + CALIBRATION_ROWS + NOT_AGGREGABLE,
        source=("confidence", "predicted_mean"),
    ),
    Metric(
        "dspark_confidence_observed_mean",
        "gauge",
        POS,
        "Observed share of accepted prefixes " + SLIDING + ". " + CALIBRATION_ROWS + NOT_AGGREGABLE,
        source=("confidence", "observed_mean"),
    ),
    Metric(
        "dspark_confidence_survival",
        "histogram",
        REL,
        "Predicted survival since start, in the 15 equal-width ECE bins, summed over ranks "
        "(reliability denominator). " + CALIBRATION_ROWS,
        source=("confidence", "survival"),
        detail=True,
    ),
    Metric(
        "dspark_confidence_accepted_survival",
        "histogram",
        REL,
        "Predicted survival of rows whose prefix was accepted, same bins (reliability "
        "numerator: observed rate per bin = this bucket / dspark_confidence_survival bucket).",
        source=("confidence", "accepted_survival"),
        detail=True,
    ),
    # calibration's sufficient statistics: counters summed over any series give that set's
    # ECE, reliability, Brier and AUROC exactly (deploy/rules/fleet.yml); the bins are summed
    # over ranks (calibration is the model's), the Brier sums are per rank
    Metric(
        "dspark_confidence_bin_rows_total",
        "counter",
        REL_BIN,
        "Labelled rows per ECE bin (bin=0..14, equal-width on [0, 1]) since start, summed "
        "over ranks.",
        source=("confidence", "bin_rows"),
    ),
    Metric(
        "dspark_confidence_bin_positives_total",
        "counter",
        REL_BIN,
        "Rows per ECE bin whose prefix was accepted.",
        source=("confidence", "bin_positives"),
    ),
    Metric(
        "dspark_confidence_bin_predicted_total",
        "counter",
        REL_BIN,
        "Sum of the predicted survival of the rows per ECE bin.",
        source=("confidence", "bin_predicted"),
    ),
    Metric(
        "dspark_confidence_bin_negatives_below_total",
        "counter",
        REL_BIN,
        "Rows whose prefix was rejected in lower ECE bins than this one: with the bin's "
        "positives and negatives (rows - positives), AUROC = sum over bins of positives x "
        "(negatives below + negatives / 2) / (positives x negatives), ties within a bin "
        "counted half.",
        source=("confidence", "bin_negatives_below"),
    ),
    Metric(
        "dspark_confidence_positives_total",
        "counter",
        POS,
        "Labelled rows whose prefix was accepted (with dspark_confidence_labelled_total and the "
        "two sums below, Brier per rank).",
        source=("confidence", "positives"),
    ),
    Metric(
        "dspark_confidence_positive_predicted_total",
        "counter",
        POS,
        "Sum of the predicted survival of rows whose prefix was accepted (Brier).",
        source=("confidence", "positive_predicted"),
    ),
    Metric(
        "dspark_confidence_predicted_squared_total",
        "counter",
        POS,
        "Sum of the squared predicted survival of labelled rows (Brier).",
        source=("confidence", "predicted_squared"),
    ),
    Metric(
        "dspark_confidence_auroc_positives_total",
        "counter",
        POS_BIN,
        "Rows whose prefix was accepted per AUROC bin (bin=0..29, equal-width on [0, 1]), "
        "per rank.",
        source=("confidence", "auroc_positives"),
        detail=True,
    ),
    Metric(
        "dspark_confidence_auroc_negatives_total",
        "counter",
        POS_BIN,
        "Rows whose prefix was rejected per AUROC bin.",
        source=("confidence", "auroc_negatives"),
        detail=True,
    ),
    Metric(
        "dspark_confidence_auroc_negatives_below_total",
        "counter",
        POS_BIN,
        "Rows whose prefix was rejected in lower AUROC bins than this one (AUROC = sum over "
        "bins of positives x (negatives below + negatives / 2) / (positives x negatives)).",
        source=("confidence", "auroc_negatives_below"),
        detail=True,
    ),
    # load per step
    Metric("dspark_steps_total", "counter", STEP, "Verify steps seen.", source=("steps", "steps")),
    Metric(
        "dspark_batch_size",
        "histogram",
        STEP,
        "Requests per verify step.",
        source=("steps", "batch_size"),
    ),
    Metric(
        "dspark_budget_tokens",
        "histogram",
        STEP,
        "Scheduler budget per step: extra verify tokens beyond one anchor per request (K); "
        "steps without a budget (static mode) are not counted.",
        source=("steps", "budget_tokens"),
    ),
    Metric(
        "dspark_verify_tokens",
        "histogram",
        STEP,
        "Tokens in the verify forward per step, after rounding up to the captured graph tier "
        "(SGLang num_verify_tokens).",
        source=("steps", "verify_tokens"),
    ),
    Metric(
        "dspark_graph_tier_tokens",
        "histogram",
        STEP,
        "Captured graph tier replayed per step (SGLang verify_tokens_graph_key).",
        source=("steps", "graph_tier_tokens"),
    ),
    # cost model
    Metric(
        "dspark_cost_model_steps_total",
        "counter",
        STEP,
        "Steps with both a cost-table prediction and a measured step time.",
        source=("cost", "steps"),
    ),
    Metric(
        "dspark_step_predicted_seconds_total",
        "counter",
        STEP,
        "Sum of the cost table's predicted step times T(bs, K).",
        source=("cost", "predicted_seconds_total"),
    ),
    Metric(
        "dspark_step_measured_seconds_total",
        "counter",
        STEP,
        "Sum of measured step times (step_gpu_ms, else step_cpu_ms) of those steps.",
        source=("cost", "measured_seconds_total"),
    ),
    Metric(
        "dspark_cost_model_abs_error_seconds_total",
        "counter",
        STEP,
        "Sum of |measured - predicted| step time.",
        source=("cost", "abs_error_seconds_total"),
    ),
    Metric(
        "dspark_step_predicted_seconds",
        "gauge",
        STEP,
        "Mean predicted step time " + SLIDING + ".",
        source=("cost", "predicted_seconds"),
    ),
    Metric(
        "dspark_step_measured_seconds",
        "gauge",
        STEP,
        "Mean measured step time " + SLIDING + ".",
        source=("cost", "measured_seconds"),
    ),
    Metric(
        "dspark_cost_model_abs_error_seconds",
        "gauge",
        STEP,
        "Mean |measured - predicted| step time " + SLIDING + ".",
        source=("cost", "abs_error_seconds"),
    ),
    Metric(
        "dspark_cost_model_bias_seconds",
        "gauge",
        STEP,
        "Mean (measured - predicted) step time " + SLIDING + "; positive: the table is optimistic.",
        source=("cost", "bias_seconds"),
    ),
    Metric(
        "dspark_cost_model_relative_error_ratio",
        "gauge",
        STEP,
        "Median |measured - predicted| / measured " + SLIDING + " (upper edge of a "
        "log-spaced bucket, 15% resolution).",
        source=("cost", "relative_error"),
    ),
    Metric(
        "dspark_cost_model_refit_r2",
        "gauge",
        STEP,
        "R^2 of the additive table T = bias + alpha(bs) + theta(M) refitted online by least "
        "squares over (bs, M-bin of 64) cells of measured step times, since start.",
        source=("cost", "refit_r2"),
    ),
    Metric(
        "dspark_cost_model_refit_rms_seconds",
        "gauge",
        STEP,
        "RMS residual of that refit, per step.",
        source=("cost", "refit_rms_seconds"),
    ),
    Metric(
        "dspark_cost_model_refit_steps",
        "gauge",
        STEP,
        "Measured steps behind that refit (it is refreshed every 1,024 measured steps).",
        source=("cost", "refit_steps"),
    ),
    # the cost model's error by context length
    Metric(
        "dspark_cost_model_context_steps_total",
        "counter",
        CTX,
        "Steps with both a cost-table prediction and a measured step time." + CONTEXT_BUCKET,
        source=("cost", "context_steps"),
    ),
    Metric(
        "dspark_cost_model_context_predicted_seconds_total",
        "counter",
        CTX,
        "Sum of the cost table's predicted step times T(bs, K) of those steps.",
        source=("cost", "context_predicted_seconds"),
    ),
    Metric(
        "dspark_cost_model_context_measured_seconds_total",
        "counter",
        CTX,
        "Sum of their measured step times; measured / predicted - 1 per bucket is how far "
        "the table drifts as conversations grow (the additive table has no context term).",
        source=("cost", "context_measured_seconds"),
    ),
    Metric(
        "dspark_cost_model_context_squared_error_total",
        "counter",
        CTX,
        "Sum of (measured - predicted)^2 of those steps, in seconds squared (RMS error per "
        "bucket: sqrt of this over the steps).",
        source=("cost", "context_squared_error"),
    ),
    Metric(
        "dspark_cost_model_context_relative_error_total",
        "counter",
        CTX,
        "Sum of |measured - predicted| / measured of those steps (mean relative error per "
        "bucket: this over the steps).",
        source=("cost", "context_relative_error"),
    ),
    Metric(
        "dspark_cost_model_context_tokens_total",
        "counter",
        CTX,
        "Sum of those steps' mean context tokens per request (mean context of a bucket: this "
        "over the steps).",
        source=("cost", "context_tokens"),
    ),
    # ceiling estimator
    Metric(
        "dspark_estimator_trimmed_blocks_total",
        "counter",
        REQ,
        "Request-steps whose whole window w < gamma was accepted (ceiling censored by "
        "trimming) and whose tail is being walked.",
        source=("estimator", "trimmed_blocks"),
    ),
    Metric(
        "dspark_estimator_skipped_blocks_total",
        "counter",
        REQ,
        "Trimmed request-steps no walk can follow (sampled without log-probabilities, or "
        "sampling unknown): only the population estimate covers them.",
        source=("estimator", "skipped_blocks"),
    ),
    Metric(
        "dspark_estimator_resolved_blocks_total",
        "counter",
        (*REQ, "source"),
        "Walks that ended: source=greedy exact (mismatch or tail used up), source=sampled "
        "with a (lo, point, hi) interval.",
        source=("estimator", "resolved_blocks"),
    ),
    Metric(
        "dspark_estimator_censored_blocks_total",
        "counter",
        (*REQ, "source"),
        "Walks cut short because the request ended first: reported as lower bounds.",
        source=("estimator", "censored_blocks"),
    ),
    Metric(
        "dspark_estimator_observed_blocks_total",
        "counter",
        REQ,
        "Request-steps whose ceiling the estimator saw exactly (a rejection inside the "
        "window, or no trimming).",
        source=("estimator", "observed_blocks"),
    ),
    Metric(
        "dspark_estimator_observed_ceiling_tokens_total",
        "counter",
        REQ,
        "Sum of those request-steps' ceilings.",
        source=("estimator", "observed_ceiling_tokens"),
    ),
    Metric(
        "dspark_estimator_walk_lower_tokens_total",
        "counter",
        REQ,
        "Sum of the lower bounds of ended walks' ceilings (resolved and censored).",
        source=("estimator", "walk_lower_tokens"),
    ),
    Metric(
        "dspark_estimator_walk_point_tokens_total",
        "counter",
        REQ,
        "Sum of the point estimates of ended walks' ceilings.",
        source=("estimator", "walk_point_tokens"),
    ),
    Metric(
        "dspark_estimator_walk_upper_tokens_total",
        "counter",
        REQ,
        "Sum of the upper bounds of ended walks' ceilings.",
        source=("estimator", "walk_upper_tokens"),
    ),
    Metric(
        "dspark_estimator_pending_blocks",
        "gauge",
        REQ,
        "Walks open now.",
        source=("estimator", "pending_blocks"),
    ),
    Metric(
        "dspark_ceiling_estimate_tokens",
        "gauge",
        (*REQ, "source"),
        "Estimated mean ceiling per request-step " + SLIDING + ": source=walk combines "
        "observed ceilings with the walks' point estimates; source=population is the "
        "sum of the population survival curve." + NOT_AGGREGABLE,
        source=("estimator", "ceiling_estimate"),
    ),
    Metric(
        "dspark_ceiling_estimate_lower_tokens",
        "gauge",
        REQ,
        "Lower bound of the walk estimate of the mean ceiling " + SLIDING + "." + NOT_AGGREGABLE,
        source=("estimator", "ceiling_estimate_lower"),
    ),
    Metric(
        "dspark_ceiling_estimate_upper_tokens",
        "gauge",
        REQ,
        "Upper bound of the walk estimate of the mean ceiling " + SLIDING + "." + NOT_AGGREGABLE,
        source=("estimator", "ceiling_estimate_upper"),
    ),
    Metric(
        "dspark_ceiling_estimate_cumulative_tokens",
        "gauge",
        REQ,
        "Walk estimate of the mean ceiling since start." + NOT_AGGREGABLE,
        source=("estimator", "ceiling_estimate_cumulative"),
    ),
    Metric(
        "dspark_population_survival_ratio",
        "gauge",
        POS,
        "Population estimate of P(first position+1 drafts accepted) over recent blocks, "
        "from (window, accepted) with hazards stratified by calibrated confidence.",
        source=("estimator", "population_survival"),
    ),
    Metric(
        "dspark_population_identifiable",
        "gauge",
        POS,
        "1 where the population survival at this position rests on observed hazards, 0 "
        "where it is extrapolated from calibrated confidence.",
        source=("estimator", "population_identifiable"),
    ),
    # the cost of trimming against static (estimator/trim_cost.py; docs/whatif.md, "Live")
    Metric(
        "dspark_trim_committed_tokens_total",
        "counter",
        REQ,
        "Tokens committed (accepted drafts + the bonus) by the request-steps of priced steps: "
        "C_o of the cost of trimming.",
        source=("trim_cost", "committed_tokens"),
    ),
    Metric(
        "dspark_trim_step_seconds_total",
        "counter",
        REQ,
        "Request-steps' shares of their step's time (step time / batch size), measured (the "
        "cost table's where untimed): T_o.",
        source=("trim_cost", "seconds"),
    ),
    Metric(
        "dspark_trim_static_step_seconds_total",
        "counter",
        REQ,
        "The same shares of the step's time at static's verify tier (batch size x (gamma + "
        "1) tokens), repriced by the cost table: T_s.",
        source=("trim_cost", "static_seconds"),
    ),
    Metric(
        "dspark_trim_static_committed_tokens_total",
        "counter",
        REQ,
        "Tokens static would have committed on the same request-steps (the ceiling + the "
        "bonus; walked tails' point estimates, added when the walk ends): C_s.",
        source=("trim_cost", "static_committed_tokens"),
    ),
    Metric(
        "dspark_trim_static_committed_lower_tokens_total",
        "counter",
        REQ,
        "Lower bound of C_s (walks' lower bounds; the window where no walk followed).",
        source=("trim_cost", "static_committed_lower_tokens"),
    ),
    Metric(
        "dspark_trim_static_committed_upper_tokens_total",
        "counter",
        REQ,
        "Upper bound of C_s (walks' upper bounds; gamma where no walk followed).",
        source=("trim_cost", "static_committed_upper_tokens"),
    ),
    Metric(
        "dspark_trim_net_tokens_per_second",
        "gauge",
        REQ,
        "Net tokens/s of the run's verify policy against static, C_o/T_o - C_s/T_s, "
        + SLIDING
        + "; positive: trimming paid."
        + NOT_AGGREGABLE,
        source=("trim_cost", "net"),
    ),
    Metric(
        "dspark_trim_net_lower_tokens_per_second",
        "gauge",
        REQ,
        "Lower bound of the net (static's upper bound), " + SLIDING + "." + NOT_AGGREGABLE,
        source=("trim_cost", "net_lower"),
    ),
    Metric(
        "dspark_trim_net_upper_tokens_per_second",
        "gauge",
        REQ,
        "Upper bound of the net (static's lower bound), " + SLIDING + "." + NOT_AGGREGABLE,
        source=("trim_cost", "net_upper"),
    ),
    Metric(
        "dspark_trim_step_time_saved_tokens_per_second",
        "gauge",
        REQ,
        "The net's step-time part, C_o/T_o - C_o/T_s, " + SLIDING + "." + NOT_AGGREGABLE,
        source=("trim_cost", "step_time_saved"),
    ),
    Metric(
        "dspark_trim_accepted_lost_tokens_per_second",
        "gauge",
        REQ,
        "The net's accepted-token part, (C_o - C_s)/T_s (<= 0), " + SLIDING + "." + NOT_AGGREGABLE,
        source=("trim_cost", "accepted_lost"),
    ),
    # ingest
    Metric(
        "dspark_ingest_records_total",
        "counter",
        SRC,
        "Step records accepted from a source.",
        source=("ingest", "records"),
    ),
    Metric(
        "dspark_ingest_errors_total",
        "counter",
        (*SRC, "reason"),
        "Ingest errors by reason; processing continues. Step records rejected (a broken "
        "telemetry invariant), failed polls (timeout, connect_failed, http_NNN, bad_json, "
        "oversized, too_deep, redirect_refused, clear_failed), steps the server dropped "
        "before a poll read them (dropped_steps, one per step), steps taken but not "
        "converted before a stop's drain ran out (dropped_at_stop, one per step), server "
        "restarts (server_restart) and step-counter jumps (forward_ct_jump).",
        source=("ingest", "errors"),
    ),
    Metric(
        "dspark_source_up",
        "gauge",
        SRC,
        "1 while the source delivers, 0 when it fails.",
        source=("ingest", "up"),
    ),
    # the production store (`serve --store`, `hook-consumer --store`)
    Metric(
        "dspark_store_bytes",
        "gauge",
        (),
        "Bytes the production store holds on disk: its closed hours and the hours being written.",
        source=("store", "bytes"),
    ),
    Metric(
        "dspark_store_deleted_steps_total",
        "counter",
        (),
        "Steps the production store's retention deleted from disk (hours past the age "
        "bound, then the oldest while over the size bound).",
        source=("store", "deleted"),
    ),
    Metric(
        "dspark_store_deleted_hours_total",
        "counter",
        (),
        "Hour partitions the production store's retention deleted.",
        source=("store", "deleted_partitions"),
    ),
    Metric(
        "dspark_dropped_steps_total",
        "counter",
        ("reason",),
        "Steps dropped before they were aggregated, by reason (hook_ring_full: the hook's "
        "consumer was a whole ring behind; serving never waits for it).",
        source=("ingest", "dropped"),
    ),
    Metric(
        "dspark_workload_overflow_total",
        "counter",
        (),
        'Request-steps counted under workload="other" because the workload cap was reached.',
        source=("workloads", "overflow"),
    ),
)
