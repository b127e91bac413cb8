CREATE TABLE `apps` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`name` text NOT NULL,
	`runtime` text NOT NULL,
	`status` text DEFAULT 'running' NOT NULL,
	`memory_mb` integer NOT NULL,
	`active_deployment_id` text,
	`restarted_at` integer NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE UNIQUE INDEX `apps_name_idx` ON `apps` (`name`);--> statement-breakpoint
CREATE INDEX `apps_account_idx` ON `apps` (`account_id`,`created_at`);--> statement-breakpoint
CREATE TABLE `disks` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`name` text NOT NULL,
	`size_gb` integer NOT NULL,
	`mount_path` text NOT NULL,
	`app_id` text,
	`status` text DEFAULT 'available' NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE set null
);
--> statement-breakpoint
CREATE UNIQUE INDEX `disks_account_name_idx` ON `disks` (`account_id`,`name`);--> statement-breakpoint
CREATE INDEX `disks_app_idx` ON `disks` (`app_id`);--> statement-breakpoint
CREATE TABLE `env_vars` (
	`app_id` text NOT NULL,
	`name` text NOT NULL,
	`value` text NOT NULL,
	`updated_at` integer NOT NULL,
	PRIMARY KEY(`app_id`, `name`),
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE cascade
);
