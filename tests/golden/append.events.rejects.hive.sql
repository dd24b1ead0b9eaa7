SELECT
  `src`,
  `off`,
  `v`,
  `op`,
  `_cdc_increment`,
  `_cdc_file`,
  `_cdc_pos`,
  `_cdc_reject_reason`
FROM (
  SELECT
    `src`,
    `off`,
    `v`,
    `op`,
    `_cdc_increment`,
    REGEXP_EXTRACT(INPUT__FILE__NAME, '[^/]+$', 0) AS `_cdc_file`,
    BLOCK__OFFSET__INSIDE__FILE + 0 AS `_cdc_pos`,
    CASE
      WHEN `src` IS NULL
      THEN 'null_event_id:src'
      WHEN `off` IS NULL
      THEN 'null_event_id:off'
      WHEN `op` IS NULL
      THEN 'null_op'
      WHEN `op` = 'u'
      THEN 'not_an_insert:update'
      WHEN `op` = 'd'
      THEN 'not_an_insert:delete'
      WHEN NOT `op` IN ('c', 'r')
      THEN 'unknown_op'
      ELSE NULL
    END AS `_cdc_reject_reason`
  FROM `fuzz`.`events_incremental`
) AS checked
WHERE
  NOT `_cdc_reject_reason` IS NULL
