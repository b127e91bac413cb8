CREATE TABLE `backups` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`disk_id` text NOT NULL,
	`status` text NOT NULL,
	`description` text DEFAULT '' NOT NULL,
	`size_bytes` integer DEFAULT 0 NOT NULL,
	`reserved_bytes` integer DEFAULT 0 NOT NULL,
	`sha256` text,
	`object_key` text NOT NULL,
	`failure_reason` text,
	`created_at` integer NOT NULL,
	`completed_at` integer,
	`expires_at` integer,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`disk_id`) REFERENCES `disks`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `backups_disk_idx` ON `backups` (`disk_id`,`created_at`);--> statement-breakpoint
CREATE INDEX `backups_account_idx` ON `backups` (`account_id`,`status`);--> statement-breakpoint
CREATE TABLE `restore_uploads` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`disk_id` text NOT NULL,
	`size_bytes` integer NOT NULL,
	`object_key` text NOT NULL,
	`multipart_upload_id` text,
	`expires_at` integer NOT NULL,
	`used_at` integer,
	`created_at` integer NOT NULL,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`disk_id`) REFERENCES `disks`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `restore_uploads_expiry_idx` ON `restore_uploads` (`expires_at`);--> statement-breakpoint
CREATE TABLE `restores` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`disk_id` text NOT NULL,
	`object_key` text NOT NULL,
	`size_bytes` integer NOT NULL,
	`sha256` text,
	`upload_id` text,
	`backup_id` text,
	`status` text NOT NULL,
	`error` text,
	`builder_job_id` text,
	`created_at` integer NOT NULL,
	`finished_at` integer,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`disk_id`) REFERENCES `disks`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `restores_disk_idx` ON `restores` (`disk_id`,`created_at`);