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
  `_cdc_pos`,
  `_cdc_reject_reason`
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
    REGEXP_EXTRACT(INPUT__FILE__NAME, '[^/]+$', 0) AS `_cdc_file`,
    BLOCK__OFFSET__INSIDE__FILE + 0 AS `_cdc_pos`,
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
    END AS `_cdc_reject_reason`
  FROM `shop`.`orders_incremental`
) AS checked
WHERE
  NOT `_cdc_reject_reason` IS NULL
