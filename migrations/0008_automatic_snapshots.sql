ALTER TABLE `backups` ADD `automatic` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `disks` ADD `snapshot_interval_hours` integer DEFAULT 24 NOT NULL;--> statement-breakpoint
ALTER TABLE `disks` ADD `snapshot_keep` integer DEFAULT 7 NOT NULL;--> statement-breakpoint
ALTER TABLE `disks` ADD `next_snapshot_at` integer DEFAULT 0;--> statement-breakpoint
ALTER TABLE `disks` ADD `snapshot_skipped` text;--> statement-breakpoint
CREATE INDEX `disks_next_snapshot_idx` ON `disks` (`next_snapshot_at`);