ALTER TABLE `apps` ADD `process_state` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `start_command` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `health_check_path` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `config_version` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `apps` ADD `pending_changes` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `start_timeout_seconds` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `min_ready_seconds` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `overlap` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `cause` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `config_version` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `process_id` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `progress` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `log_excerpt` text;