"""The Airflow side: one DAG per registry table (the factory), the provider entry, the plugin and its CDC tables pages.

Importing it is cheap: the factory imports the pipeline's steps only inside the tasks.
"""
