CREATE TABLE `nodes` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`address` text NOT NULL,
	`state` text DEFAULT 'ready' NOT NULL,
	`cores` integer DEFAULT 0 NOT NULL,
	`memory_mb` integer DEFAULT 0 NOT NULL,
	`disk_total_bytes` integer DEFAULT 0 NOT NULL,
	`disk_free_bytes` integer DEFAULT 0 NOT NULL,
	`running_jobs` integer DEFAULT 0 NOT NULL,
	`processes` integer DEFAULT 0 NOT NULL,
	`pid` integer,
	`joined_at` integer NOT NULL,
	`last_heartbeat_at` integer NOT NULL,
	`lost_at` integer
);
--> statement-breakpoint
CREATE UNIQUE INDEX `nodes_name_idx` ON `nodes` (`name`);--> statement-breakpoint
ALTER TABLE `disks` ADD `node_id` text;--> statement-breakpoint
ALTER TABLE `disks` ADD `generation` integer DEFAULT 1 NOT NULL;--> statement-breakpoint
ALTER TABLE `disks` ADD `placement_note` text;--> statement-breakpoint
CREATE INDEX `disks_node_idx` ON `disks` (`node_id`);