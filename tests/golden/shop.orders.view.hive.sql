SELECT
  `tenant`,
  `order_no`,
  `amount`,
  `status`,
  `timestamp`,
  `order`,
  `op`,
  `ts_ms`,
  `lsn`
FROM (
  SELECT
    events.*,
    ROW_NUMBER() OVER (
      PARTITION BY `tenant`, `order_no`
      ORDER BY `lsn` DESC, `_cdc_increment` DESC, `_cdc_file` DESC, `_cdc_pos` DESC
    ) AS `_cdc_rank`
  FROM (
    SELECT
      `tenant`,
      `order_no`,
      `amount`,
      `status`,
      `timestamp`,
      `order`,
      `op`,
      `ts_ms`,
      `lsn`,
      `_cdc_increment`,
      `_cdc_file`,
      `_cdc_pos`
    FROM `shop`.`orders_base`
    UNION ALL
    SELECT
      `tenant`,
      `order_no`,
      `amount`,
      `status`,
      `timestamp`,
      `order`,
      `op`,
      `ts_ms`,
      `lsn`,
      `_cdc_increment`,
      `_cdc_file`,
      `_cdc_pos`
    FROM `shop`.`orders_tombstones`
    UNION ALL
    SELECT
      `tenant`,
      `order_no`,
      `amount`,
      `status`,
      `timestamp`,
      `order`,
      `op`,
      `ts_ms`,
      `lsn`,
      `_cdc_increment`,
      REGEXP_EXTRACT(INPUT__FILE__NAME, '[^/]+$', 0) AS `_cdc_file`,
      BLOCK__OFFSET__INSIDE__FILE + 0 AS `_cdc_pos`
    FROM `shop`.`orders_incremental`
    WHERE
      (
        CASE
          WHEN `tenant` IS NULL
          THEN 'null_key:tenant'
          WHEN `order_no` IS NULL
          THEN 'null_key:order_no'
          WHEN `lsn` IS NULL
          THEN 'null_order_by:lsn'
          WHEN `op` IS NULL
          THEN 'null_op'
          WHEN NOT `op` IN ('c', 'r', 'u', 'd')
          THEN 'unknown_op'
          ELSE NULL
        END
      ) IS NULL
  ) AS events
) AS ranked
WHERE
  `_cdc_rank` = 1 AND NOT (
    `op` = 'd'
  )
