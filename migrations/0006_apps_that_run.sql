ALTER TABLE `apps` ADD `live_process_id` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `live_node` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `release_key` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `release_sha256` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `release_bytes` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `process_type` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `start_command` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `port` integer;--> statement-breakpoint
ALTER TABLE `deployments` ADD `health_check_path` text;