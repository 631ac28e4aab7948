-- The per-workload entries of `dspark-obs summary --json`, in standard SQL.
--
-- It reads two relations: `requests` and `steps`, the run store's tables over every run of
-- the fleet, each with a `run` column naming the run directory a row came from (its part's
-- folder's parent), so (run, rank, forward_ct) names one step across a fleet.
-- `dspark-obs summary --sql RUN_DIR...` prints DuckDB's definition of the two before this
-- query; docs/store.md gives Spark's and Trino's. Every figure is a ratio of sums, as in
-- `summary`: means over request-steps, ceiling figures over rows whose ceiling is known.
-- Throughput is the sum over streams (a run's rank: they serve side by side) of the
-- stream's committed tokens over its own step time, as the report's load curve sums ranks.
WITH req AS (
  SELECT
    workload, run, rank, forward_ct, verify_len, correct_drafts, acc_len,
    ceiling, shadow_ceiling, COALESCE(ceiling, shadow_ceiling) AS known_ceiling
  FROM requests
),
stream_time AS (
  SELECT run, rank, SUM(step_gpu_ms) / 1000.0 AS seconds
  FROM steps
  GROUP BY run, rank
),
stream_tokens AS (
  SELECT workload, run, rank, SUM(acc_len) AS tokens
  FROM req
  GROUP BY workload, run, rank
),
rates AS (
  SELECT k.workload, SUM(CAST(k.tokens AS DOUBLE) / t.seconds) AS throughput
  FROM stream_tokens AS k
  JOIN stream_time AS t ON t.run = k.run AND t.rank = k.rank AND t.seconds > 0
  GROUP BY k.workload
),
per_workload AS (
  SELECT
    workload,
    COUNT(*) AS request_steps,
    SUM(verify_len - 1) AS window_sum,
    SUM(correct_drafts) AS accepted_sum,
    SUM(acc_len) AS committed_tokens,
    COUNT(known_ceiling) AS ceiling_rows,
    SUM(CASE WHEN known_ceiling IS NOT NULL THEN correct_drafts END) AS accepted_known,
    SUM(known_ceiling) AS ceiling_sum,
    SUM(
      CASE WHEN known_ceiling > correct_drafts THEN known_ceiling - correct_drafts ELSE 0 END
    ) AS trimmed,
    SUM(verify_len) AS verify_sum,
    COUNT(ceiling) AS observed_rows,
    COUNT(shadow_ceiling) AS shadow_rows
  FROM req
  GROUP BY workload
),
step_counts AS (
  SELECT workload, COUNT(*) AS steps
  FROM (SELECT DISTINCT workload, run, rank, forward_ct FROM req) AS distinct_steps
  GROUP BY workload
)
SELECT
  w.workload,
  c.steps,
  w.request_steps,
  CAST(w.window_sum AS DOUBLE) / w.request_steps AS mean_window,
  CAST(w.accepted_sum AS DOUBLE) / w.request_steps AS mean_accepted,
  CAST(w.committed_tokens AS DOUBLE) / w.request_steps AS mean_committed,
  CASE WHEN w.ceiling_rows > 0 THEN CAST(w.ceiling_sum AS DOUBLE) / w.ceiling_rows END
    AS mean_ceiling,
  CASE WHEN w.observed_rows > 0 THEN 'observed' WHEN w.shadow_rows > 0 THEN 'shadow' END
    AS ceiling_source,
  w.ceiling_rows,
  CASE WHEN w.ceiling_rows > 0 AND w.ceiling_sum > 0
    THEN CAST(w.accepted_known AS DOUBLE) / w.ceiling_sum END AS utilisation,
  CASE WHEN w.ceiling_rows > 0 THEN w.trimmed END AS trimmed_tokens,
  CAST(w.verify_sum AS DOUBLE) / w.request_steps AS mean_verify_tokens,
  w.committed_tokens,
  r.throughput AS throughput_tokens_per_s
FROM per_workload AS w
JOIN step_counts AS c ON c.workload IS NOT DISTINCT FROM w.workload
LEFT JOIN rates AS r ON r.workload IS NOT DISTINCT FROM w.workload
ORDER BY w.workload NULLS FIRST
