SELECT
  `src`,
  `off`,
  `v`,
  `op`
FROM (
  SELECT
    `src`,
    `off`,
    `v`,
    `op`
  FROM (
    SELECT
      `src`,
      `off`,
      `v`,
      `op`
    FROM `fuzz`.`events_base`
  ) AS `_cdc_b`
  UNION ALL
  SELECT
    `src`,
    `off`,
    `v`,
    `op`
  FROM (
    SELECT
      `_cdc_f`.`src`,
      `_cdc_f`.`off`,
      `_cdc_f`.`v`,
      `_cdc_f`.`op`,
      `_cdc_f`.`_cdc_increment`,
      `_cdc_f`.`_cdc_file`,
      `_cdc_f`.`_cdc_pos`
    FROM (
      SELECT
        `src`,
        `off`,
        `v`,
        `op`,
        `_cdc_increment`,
        `_cdc_file`,
        `_cdc_pos`,
        CASE
          WHEN `_cdc_seen` = 1
          THEN 'replayed'
          WHEN `_cdc_rank` > 1
          THEN 'superseded'
          ELSE 'appended'
        END AS `_cdc_fate`
      FROM (
        SELECT
          `_cdc_e`.`src`,
          `_cdc_e`.`off`,
          `_cdc_e`.`v`,
          `_cdc_e`.`op`,
          `_cdc_e`.`_cdc_increment`,
          `_cdc_e`.`_cdc_file`,
          `_cdc_e`.`_cdc_pos`,
          `_cdc_k`.`_cdc_seen`,
          ROW_NUMBER() OVER (
            PARTITION BY `_cdc_e`.`src`, `_cdc_e`.`off`
            ORDER BY `_cdc_e`.`_cdc_increment`, `_cdc_e`.`_cdc_file`, `_cdc_e`.`_cdc_pos`
          ) AS `_cdc_rank`
        FROM (
          SELECT
            `src`,
            `off`,
            `v`,
            `op`,
            `_cdc_increment`,
            REGEXP_EXTRACT(INPUT__FILE__NAME, '[^/]+$', 0) AS `_cdc_file`,
            BLOCK__OFFSET__INSIDE__FILE + 0 AS `_cdc_pos`
          FROM `fuzz`.`events_incremental`
          WHERE
            (
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
              END
            ) IS NULL
        ) AS `_cdc_e`
        LEFT JOIN (
          SELECT DISTINCT
            `_cdc_b`.`src`,
            `_cdc_b`.`off`,
            1 AS `_cdc_seen`
          FROM (
            SELECT
              `src`,
              `off`,
              `v`,
              `op`
            FROM `fuzz`.`events_base`
          ) AS `_cdc_b`
        ) AS `_cdc_k`
          ON `_cdc_e`.`src` = `_cdc_k`.`src` AND `_cdc_e`.`off` = `_cdc_k`.`off`
      ) AS `_cdc_ranked`
    ) AS `_cdc_f`
    WHERE
      `_cdc_f`.`_cdc_fate` = 'appended'
  ) AS `_cdc_a`
) AS `_cdc_rows`
