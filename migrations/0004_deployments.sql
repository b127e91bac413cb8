CREATE TABLE `deployments` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`app_id` text NOT NULL,
	`status` text NOT NULL,
	`error` text,
	`source_key` text NOT NULL,
	`source_size_bytes` integer NOT NULL,
	`upload_expires_at` integer NOT NULL,
	`framework` text,
	`output_dir` text,
	`spa` integer,
	`manifest_key` text,
	`file_count` integer,
	`total_bytes` integer,
	`uploaded_blobs` integer,
	`peak_memory_bytes` integer,
	`builder_job_id` text,
	`created_at` integer NOT NULL,
	`started_at` integer,
	`built_at` integer,
	`finished_at` integer,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `deployments_app_idx` ON `deployments` (`app_id`,`created_at`);--> statement-breakpoint
CREATE TABLE `request_logs` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`app_id` text NOT NULL,
	`at` integer NOT NULL,
	`method` text NOT NULL,
	`path` text NOT NULL,
	`status` integer NOT NULL,
	`bytes` integer NOT NULL,
	`duration_ms` integer NOT NULL,
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `request_logs_app_idx` ON `request_logs` (`app_id`,`id`);