CREATE TABLE `node_join_tokens` (
	`id` text PRIMARY KEY NOT NULL,
	`hash` text NOT NULL,
	`uses_left` integer NOT NULL,
	`max_cores` integer,
	`max_memory_mb` integer,
	`max_disk_bytes` integer,
	`note` text,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`last_used_at` integer
);
--> statement-breakpoint
CREATE UNIQUE INDEX `node_join_tokens_hash_idx` ON `node_join_tokens` (`hash`);--> statement-breakpoint
ALTER TABLE `nodes` ADD `memory_free_mb` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `nodes` ADD `max_cores` integer;--> statement-breakpoint
ALTER TABLE `nodes` ADD `max_memory_mb` integer;--> statement-breakpoint
ALTER TABLE `nodes` ADD `max_disk_bytes` integer;